# Thin wrapper over CMake. `make run`: build and run the main job.
# `make test`: build and run every test (C via ctest, also under ASan+UBSan,
# Python via pytest against PyTorch, and the libFuzzer targets). Both first check the Debian
# packages they need (tools/deps.sh, list in tools/debian-packages.txt) and
# install the missing ones when run as root.
# `make install [PREFIX=/usr/local]`: library, header, attn.pc, molgen and the
# Python packages attn and molgen (python/pyproject.toml; see README, Quick start).
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
DEPS = tools/deps.sh
export OPENBLAS_CORETYPE ?= Haswell
# idle OpenMP threads sleep instead of spinning: on a loaded 2-core machine the
# spinning starved the working threads (README, "OMP_WAIT_POLICY")
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: all deps build build-asan run demo test test-c test-asan test-python test-fuzz install clean

all: build

deps:
	@$(DEPS) build run test

build:
	@$(DEPS) build
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DATTN_PYTHON=$(PYTHON) >/dev/null
	cmake --build build -j $(JOBS)

build-asan:
	@$(DEPS) build
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DATTN_SANITIZE=ON -DATTN_PYTHON=$(PYTHON) >/dev/null
	cmake --build build-asan -j $(JOBS)

demo: build
	./build/attn-demo

# The package check comes first, before any prerequisite is built.
run:
	@$(DEPS) build run
	@$(MAKE) --no-print-directory build
	PYTHON=$(PYTHON) bash tools/run_main_job.sh

test-c: build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# molgen's Python tests: molgen/tests/<subject>/test_*.py; the MPI ones
# (molgen/tests/mpi/) run under ctest, in groups (molgen/CMakeLists.txt).
MOLGEN_PY_TESTS = $(filter-out molgen/tests/mpi/%,$(wildcard molgen/tests/*/test_*.py))
# PYTHONPATH: the packages in python/ (attn, molgen) for the tests and the
# programs they start (`python3 -m molgen.metrics ...`)
test-python: build
	PYTHONPATH=$(CURDIR)/python ATTN_LIBRARY=$(CURDIR)/build/libattn.so $(PYTHON) -m pytest -q -rs python/tests $(MOLGEN_PY_TESTS)

# libFuzzer targets (clang, ASan+UBSan), FUZZ_SECONDS each; a longer run is
# `molgen/fuzz/run_fuzz.sh 600`.
FUZZ_SECONDS ?= 10
test-fuzz:
	bash molgen/fuzz/run_fuzz.sh $(FUZZ_SECONDS)

test:
	@$(DEPS) build test
	@$(MAKE) --no-print-directory test-c test-asan test-python test-fuzz

install: build
	cmake --install build --prefix $(PREFIX)

clean:
	rm -rf build build-asan build-fuzz
