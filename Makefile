# qwenc - see README.md.  make | make test | make asan | make clean
CC      ?= cc
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -Wall -Wextra -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc
LDLIBS  += -lcjson -lm -lpthread
BUILD   ?= build

SRC := $(wildcard src/core/*.c src/formats/*.c src/tensor/*.c src/kernels/*.c src/blocks/*.c \
                  src/models/*.c src/runtime/*.c)
OBJ := $(SRC:%.c=$(BUILD)/%.o)
LIB := $(BUILD)/libqwenc.a
BIN := $(BUILD)/qwenc
TEST_BIN := $(BUILD)/qwenc-test

.PHONY: all test asan clean check-deps

all: check-deps $(BIN) $(LIB)

check-deps:
	@test -f /usr/include/cjson/cJSON.h || { \
	  echo "qwenc needs cJSON: sudo apt-get install libcjson-dev" >&2; exit 1; }

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(BUILD)/tools/qwenc.o $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(TEST_BIN): $(BUILD)/tests/test_main.o $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

test: check-deps $(BIN) $(TEST_BIN)
	QWENC=$(BIN) $(TEST_BIN) tests/fixtures
	QWENC=$(BIN) QWENC_TEST=$(TEST_BIN) bash tests/cli_test.sh

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build directory.
asan:
	$(MAKE) BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDFLAGS="-fsanitize=address,undefined" test

clean:
	rm -rf build build-asan

-include $(OBJ:.o=.d) $(BUILD)/tools/qwenc.d $(BUILD)/tests/test_main.d
