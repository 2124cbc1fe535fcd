/* Throughput of AVX512_BF16's VDPBF16PS against AVX-512's VFMADD231PS on
 * one core: 12 independent accumulator chains each, so the loop measures
 * issue rate, not latency (docs/speed.md: why bf16 can trail fp32 on a CPU
 * whose bf16 dot product issues less often than its FMAs).
 *   gcc -O2 bench/bf16_dot_throughput.c -o /tmp/bf16dot && taskset -c 1 /tmp/bf16dot
 * Needs a CPU with AVX512_BF16 (it does not check). FLOPs: a VDPBF16PS is
 * 32 multiply-adds (64 FLOP), a VFMADD231PS 16 (32 FLOP). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx512f,avx512bf16"))) static double run_dp(long n, float *out){
  __m512 a[12]; for(int i=0;i<12;i++) a[i]=_mm512_set1_ps(0.f);
  __m512bh x=(__m512bh)_mm512_set1_epi16(0x3f80), y=(__m512bh)_mm512_set1_epi16(0x3f80);
  double t=now();
  for(long k=0;k<n;k++){
#define D(i) a[i]=_mm512_dpbf16_ps(a[i],x,y);
    D(0)D(1)D(2)D(3)D(4)D(5)D(6)D(7)D(8)D(9)D(10)D(11)
    __asm__ volatile("" : "+v"(x));
  }
  t=now()-t; float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]); *out=s; return t;
}
__attribute__((target("avx512f,fma"))) static double run_fma(long n, float *out){
  __m512 a[12]; for(int i=0;i<12;i++) a[i]=_mm512_set1_ps(0.f);
  __m512 x=_mm512_set1_ps(1.0f), y=_mm512_set1_ps(1e-9f);
  double t=now();
  for(long k=0;k<n;k++){
#define F(i) a[i]=_mm512_fmadd_ps(x,y,a[i]);
    F(0)F(1)F(2)F(3)F(4)F(5)F(6)F(7)F(8)F(9)F(10)F(11)
    __asm__ volatile("" : "+v"(x));
  }
  t=now()-t; float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]); *out=s; return t;
}
int main(void){ float o; long n=50000000;
  for(int r=0;r<3;r++){ double td=run_dp(n,&o), tf=run_fma(n,&o);
   printf("round %d: vdpbf16ps %.2f G-instr/s (%.1f GFLOP/s), vfmadd231ps %.2f G-instr/s (%.1f GFLOP/s)\n", r,
     12.0*n/td*1e-9, 12.0*n/td*1e-9*64, 12.0*n/tf*1e-9, 12.0*n/tf*1e-9*32);}
}
