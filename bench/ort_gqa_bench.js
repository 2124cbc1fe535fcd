// onnxruntime's CPU GroupQueryAttention (com.microsoft) with fewer K/V heads
// than query heads: the peer for libattn's grouped-query forward
// (bench/speed_report.py --only variants; issue 36).
//
//   NODE_PATH=/tmp/ort/node_modules node bench/ort_gqa_bench.js THREADS \
//       [--kv-heads-div G] B,H,L,L,D,causal ...
//
// Each case runs GroupQueryAttention (always causal: the case must say
// causal 1) with num_heads H and kv_num_heads H / G (default G 4) on q
// [B, L, H*D], k and v [B, L, (H/G)*D], no past: one warm-up run, then the
// median of about 0.5 s of runs (at least 5, at most 51), as attn-bench times.
// The last query row of every head is checked against a float64 softmax
// over its group's K/V head (query head h reads K/V head floor(h / G)); the
// line says the largest difference (maxerr). One JSON line per case:
//   {"prog": "ort-gqa", "op": "fwd", "B", "H", "Hkv", "Lq", "Lk", "D", "causal", "ms", "maxerr"}
// The model is encoded here (the few ONNX protobuf fields it needs), so no
// onnx package is needed.
'use strict';
const ort = require('onnxruntime-node');

// ------------------------------------------------------------ protobuf
// Encoders return arrays of bytes; a message is the concatenation of its fields.
function uvarint(n) {
  const bytes = [];
  let v = BigInt(n);
  for (;;) {
    const low = Number(v & 127n);
    v >>= 7n;
    if (v === 0n) { bytes.push(low); return bytes; }
    bytes.push(low | 128);
  }
}
const tag = (field, wire) => uvarint(field * 8 + wire);
const pbInt = (field, n) => tag(field, 0).concat(uvarint(n));
const pbLen = (field, bytes) => tag(field, 2).concat(uvarint(bytes.length), bytes);
const pbText = (field, s) => pbLen(field, Array.from(Buffer.from(s, 'utf8')));
const cat = (parts) => [].concat(...parts);

const ELEM_FLOAT = 1, ELEM_INT32 = 6, ATTR_INT = 2;

// ValueInfoProto {name 1, type 2 {tensor_type 1 {elem_type 1, shape 2 {dim 1 {dim_value 1}}}}}
function tensorInfo(name, elem, dims) {
  const shape = cat(dims.map((d) => pbLen(1, pbInt(1, d))));
  return cat([pbText(1, name), pbLen(2, pbLen(1, cat([pbInt(1, elem), pbLen(2, shape)])))]);
}

function gqaModel(B, H, Hkv, L, D) {
  // NodeProto {input 1, output 2, name 3, op_type 4, attribute 5, domain 7};
  // AttributeProto {name 1, i 3, type 20}; an empty input name skips the
  // optional past_key / past_value
  const attr = (name, v) => pbLen(5, cat([pbText(1, name), pbInt(3, v), pbInt(20, ATTR_INT)]));
  const ins = ['query', 'key', 'value', '', '', 'seqlens_k', 'total_sequence_length'];
  const outs = ['output', 'present_key', 'present_value'];
  const nodeMsg = cat([...ins.map((s) => pbText(1, s)), ...outs.map((s) => pbText(2, s)),
    pbText(3, 'gqa'), pbText(4, 'GroupQueryAttention'), attr('num_heads', H),
    attr('kv_num_heads', Hkv), pbText(7, 'com.microsoft')]);
  // GraphProto {node 1, name 2, input 11, output 12}
  const graph = cat([pbLen(1, nodeMsg), pbText(2, 'gqa_graph'),
    pbLen(11, tensorInfo('query', ELEM_FLOAT, [B, L, H * D])),
    pbLen(11, tensorInfo('key', ELEM_FLOAT, [B, L, Hkv * D])),
    pbLen(11, tensorInfo('value', ELEM_FLOAT, [B, L, Hkv * D])),
    pbLen(11, tensorInfo('seqlens_k', ELEM_INT32, [B])),
    pbLen(11, tensorInfo('total_sequence_length', ELEM_INT32, [1])),
    pbLen(12, tensorInfo('output', ELEM_FLOAT, [B, L, H * D])),
    pbLen(12, tensorInfo('present_key', ELEM_FLOAT, [B, Hkv, L, D])),
    pbLen(12, tensorInfo('present_value', ELEM_FLOAT, [B, Hkv, L, D]))]);
  // ModelProto {ir_version 1, producer_name 2, graph 7, opset_import 8 {domain 1, version 2}}
  const opset = (domain, v) => pbLen(8, cat([pbText(1, domain), pbInt(2, v)]));
  return Uint8Array.from(cat([pbInt(1, 9), pbText(2, 'attn-ort-gqa-bench'), pbLen(7, graph),
    opset('', 17), opset('com.microsoft', 1)]));
}

// ------------------------------------------------------------ data, oracle
function filled(n, salt) {
  // a fixed, cheap hash in [-1, 1): the same inputs on every run
  const a = new Float32Array(n);
  let s = (salt * 2654435761) >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s ^ (s >>> 15), 2246822519) + i) >>> 0;
    a[i] = ((s >>> 8) & 0xffff) / 32768 - 1;
  }
  return a;
}

// float64 causal attention of one query row (b, h, i) against its K/V head
function rowError(out, q, k, v, B, H, Hkv, L, D, b, h, i) {
  const hk = Math.floor(h / (H / Hkv)), sc = 1 / Math.sqrt(D);
  const qAt = (d) => q[((b * L + i) * H + h) * D + d];
  const kvAt = (x, j, d) => x[((b * L + j) * Hkv + hk) * D + d];
  const w = [];
  let top = -Infinity;
  for (let j = 0; j <= i; j++) {
    let dot = 0;
    for (let d = 0; d < D; d++) dot += qAt(d) * kvAt(k, j, d);
    w.push(dot * sc);
    top = Math.max(top, dot * sc);
  }
  let z = 0;
  for (let j = 0; j <= i; j++) { w[j] = Math.exp(w[j] - top); z += w[j]; }
  let worst = 0;
  for (let d = 0; d < D; d++) {
    let o = 0;
    for (let j = 0; j <= i; j++) o += w[j] * kvAt(v, j, d);
    worst = Math.max(worst, Math.abs(o / z - out[((b * L + i) * H + h) * D + d]));
  }
  return worst;
}

// ------------------------------------------------------------ main
async function timeCase(threads, G, spec) {
  const f = spec.split(',');
  const [B, H, Lq, Lk, D] = f.slice(0, 5).map(Number);
  const causal = f[5] === '1' || f[5] === 'yes' || f[5] === 'true';
  if (f.length !== 6 || Lq !== Lk || !causal || H % G !== 0 || ![B, H, Lq, D].every((x) => x > 0))
    throw new Error(`case ${spec}: GroupQueryAttention takes causal self-attention ` +
                    `B,H,L,L,D,1 with H divisible by ${G}`);
  const L = Lq, Hkv = H / G;
  const sess = await ort.InferenceSession.create(gqaModel(B, H, Hkv, L, D), {
    executionProviders: ['cpu'], intraOpNumThreads: threads, interOpNumThreads: 1,
    graphOptimizationLevel: 'all', executionMode: 'sequential',
  });
  const q = filled(B * L * H * D, 1), k = filled(B * L * Hkv * D, 2), v = filled(B * L * Hkv * D, 3);
  const feeds = {
    query: new ort.Tensor('float32', q, [B, L, H * D]),
    key: new ort.Tensor('float32', k, [B, L, Hkv * D]),
    value: new ort.Tensor('float32', v, [B, L, Hkv * D]),
    seqlens_k: new ort.Tensor('int32', new Int32Array(B).fill(L - 1), [B]),
    total_sequence_length: new ort.Tensor('int32', Int32Array.of(L), [1]),
  };
  let t0 = process.hrtime.bigint();
  const res = await sess.run(feeds);
  const warm = Number(process.hrtime.bigint() - t0) / 1e9;
  // the last query row (it sees every key) of every head: a wrong head
  // mapping (e.g. h % Hkv) shows on some head
  let maxerr = 0;
  for (let h = 0; h < H; h++)
    maxerr = Math.max(maxerr, rowError(res.output.data, q, k, v, B, H, Hkv, L, D, B - 1, h, L - 1));
  const n = Math.min(51, Math.max(5, Math.floor(0.5 / Math.max(warm, 1e-6))));
  const ts = [];
  for (let r = 0; r < n; r++) {
    t0 = process.hrtime.bigint();
    await sess.run(feeds);
    ts.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  ts.sort((a, b) => a - b);
  await sess.release();
  return { prog: 'ort-gqa', op: 'fwd', B, H, Hkv, Lq: L, Lk: L, D, causal: true,
           ms: +ts[n >> 1].toFixed(3), maxerr, runs: n };
}

async function main() {
  const args = process.argv.slice(2);
  const threads = parseInt(args.shift(), 10);
  let G = 4;
  if (args[0] === '--kv-heads-div') { args.shift(); G = parseInt(args.shift(), 10); }
  if (!(threads >= 1) || !(G >= 1) || args.length === 0) {
    console.error('usage: node bench/ort_gqa_bench.js THREADS [--kv-heads-div G] B,H,L,L,D,1 ...');
    process.exit(2);
  }
  for (const spec of args) console.log(JSON.stringify(await timeCase(threads, G, spec)));
}

main().catch((e) => { console.error('ort_gqa_bench: ' + e.message); process.exit(1); });
