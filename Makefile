# Thin wrapper over CMake. `make run`: build and run the main job.
# `make test`: build and run every test (C via ctest, also under ASan+UBSan,
# and Python via pytest against PyTorch).
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
export OPENBLAS_CORETYPE ?= Haswell

.PHONY: all build build-asan run demo test test-c test-asan test-python clean

all: build

build:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build -j $(JOBS)

build-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DATTN_SANITIZE=ON >/dev/null
	cmake --build build-asan -j $(JOBS)

demo: build
	./build/attn-demo

run: build
	PYTHON=$(PYTHON) bash molgen/run_main_job.sh

test-c: build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

test-python: build
	ATTN_LIBRARY=$(CURDIR)/build/libattn.so $(PYTHON) -m pytest -q python/tests $(wildcard molgen/tests/*.py)

test: test-c test-asan test-python

clean:
	rm -rf build build-asan
