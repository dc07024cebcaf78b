# The node firmware for a bare-metal Cortex-M4F (qemu's mps2-an386), built against the real
# Arduino libraries where a user has them: $ARDUINO_LIBRARIES, ~/Arduino/libraries, then the
# project's shared vendor folder. Objects are cached under $(M4_BUILD); nothing is copied.
#   make m4            the default models' firmware (CMSIS-NN kernels, as the Arduino library)
#   make m4-bench      the docs/benchmarks/node-m4 figures (instructions, ms, flash, RAM)
M4_MODELS ?= pm10-ispra-1min pm2_5-antwerp-1h pm10-ispra-1min-rh-temp
# Where the model directories named in M4_MODELS are (the window sweep's are under the build).
M4_MODEL_ROOT ?= $(abspath ../models)
M4_BUILD ?= $(BUILD)/m4
VENDOR_LIBRARIES ?= $(abspath $(CURDIR)/../../shared/vendor/arduino-libraries)
LIBRARY_DIRS := $(ARDUINO_LIBRARIES) $(HOME)/Arduino/libraries $(VENDOR_LIBRARIES)
TFLM_ROOT ?= $(patsubst %/src/TensorFlowLite.h,%,$(firstword $(foreach d,$(LIBRARY_DIRS),$(wildcard $(d)/Arduino_TensorFlowLite/src/TensorFlowLite.h))))
CRYPTO_ROOT ?= $(patsubst %/Ed25519.h,%,$(firstword $(foreach d,$(LIBRARY_DIRS),$(wildcard $(d)/Crypto/Ed25519.h))))
QEMU ?= qemu-system-arm

M4_CC := arm-none-eabi-gcc
M4_CXX := arm-none-eabi-g++
M4_CPU := -mcpu=cortex-m4 -mthumb -mfloat-abi=hard -mfpu=fpv4-sp-d16
# KERNELS=portable compiles CMSIS-NN without its DSP (SIMD) paths: its plain-C fallbacks.
KERNELS ?= cmsis-nn
M4_KERNEL_FLAGS_cmsis-nn :=
M4_KERNEL_FLAGS_portable := -U__ARM_FEATURE_DSP
M4_COMMON := $(M4_CPU) -O2 -ffunction-sections -fdata-sections -DARDUINO=10819 \
             $(M4_KERNEL_FLAGS_$(KERNELS))
M4_LIB_INCLUDES := -I$(TFLM_ROOT)/src -I$(TFLM_ROOT)/src/third_party/flatbuffers/include \
                   -I$(TFLM_ROOT)/src/third_party/gemmlowp -I$(TFLM_ROOT)/src/third_party/ruy \
                   -I$(TFLM_ROOT)/src/third_party/cmsis_nn/Include -I$(CRYPTO_ROOT)
M4_CXXFLAGS := $(M4_COMMON) -std=c++17 -fno-exceptions -fno-rtti -fno-threadsafe-statics \
               -fno-use-cxa-atexit
M4_LDFLAGS := $(M4_CPU) -nostartfiles -specs=nano.specs -specs=nosys.specs -u _printf_float \
              -Wl,--gc-sections -T m4/mps2_an386.ld

TFLM_MICRO := micro_interpreter micro_allocator micro_allocation_info micro_context micro_graph \
  micro_log micro_string micro_utils memory_helpers micro_resource_variable flatbuffer_utils \
  micro_profiler arena_allocator/single_arena_buffer_allocator \
  arena_allocator/non_persistent_arena_buffer_allocator \
  arena_allocator/persistent_arena_buffer_allocator memory_planner/greedy_memory_planner \
  memory_planner/linear_memory_planner memory_planner/non_persistent_buffer_planner_shim \
  tflite_bridge/flatbuffer_conversions_bridge tflite_bridge/micro_error_reporter \
  tflite_bridge/op_resolver_bridge
# The kernels of the ops the default int8 graphs use (TESLA_MODEL_OPS); the Arduino library
# ships ADD, FULLY_CONNECTED, MUL and SOFTMAX only as CMSIS-NN kernels.
TFLM_KERNELS := kernel_util micro_tensor_utils elementwise add_common cmsis_nn/add \
  fully_connected_common cmsis_nn/fully_connected reduce reduce_common mul_common cmsis_nn/mul \
  reshape softmax_common cmsis_nn/softmax strided_slice sub sub_common transpose
TFLM_OTHER := tensorflow/lite/core/api/flatbuffer_conversions tensorflow/lite/core/api/error_reporter \
  tensorflow/lite/core/api/op_resolver tensorflow/lite/core/api/tensor_utils \
  tensorflow/lite/core/c/common tensorflow/lite/kernels/kernel_util \
  tensorflow/lite/kernels/internal/quantization_util \
  tensorflow/lite/kernels/internal/portable_tensor_utils \
  tensorflow/lite/kernels/internal/tensor_utils \
  tensorflow/lite/kernels/internal/reference/portable_tensor_utils \
  tensorflow/lite/schema/schema_utils
TFLM_CPP := $(addprefix tensorflow/lite/micro/,$(TFLM_MICRO)) \
  $(addprefix tensorflow/lite/micro/kernels/,$(TFLM_KERNELS)) $(TFLM_OTHER)
CMSIS_NN_C = $(patsubst $(TFLM_ROOT)/src/%.c,%,$(wildcard $(TFLM_ROOT)/src/third_party/cmsis_nn/Source/*/*.c))
CRYPTO_CPP := Ed25519 SHA512 Hash BigNumberUtil Curve25519 Crypto

M4_LIB_DIR := $(M4_BUILD)/lib-$(KERNELS)
M4_LIB_OBJS = $(addprefix $(M4_LIB_DIR)/tflm/,$(addsuffix .o,$(TFLM_CPP) $(CMSIS_NN_C))) \
              $(addprefix $(M4_LIB_DIR)/crypto/,$(addsuffix .o,$(CRYPTO_CPP)))
M4_BOARD := startup board tflm_platform node_main
M4_KEY ?= $(M4_BUILD)/keys/release_key.pub

.PHONY: m4 m4-libraries m4-bench m4-sweep m4-enclosure int16-kernels-test
m4-libraries:
	@test -n "$(TFLM_ROOT)" || { echo "skip: Arduino_TensorFlowLite not found in: $(LIBRARY_DIRS)" >&2; exit 3; }
	@test -n "$(CRYPTO_ROOT)" || { echo "skip: Crypto (rweather) not found in: $(LIBRARY_DIRS)" >&2; exit 3; }

# Library objects (warnings are the library's own business: no -Werror there).
$(M4_LIB_DIR)/tflm/%.o: $(TFLM_ROOT)/src/%.cpp | m4-libraries
	@mkdir -p $(@D)
	$(M4_CXX) $(M4_CXXFLAGS) -w $(M4_LIB_INCLUDES) -c $< -o $@
$(M4_LIB_DIR)/tflm/%.o: $(TFLM_ROOT)/src/%.c | m4-libraries
	@mkdir -p $(@D)
	$(M4_CC) $(M4_COMMON) -std=c99 -w $(M4_LIB_INCLUDES) -c $< -o $@
$(M4_LIB_DIR)/crypto/%.o: $(CRYPTO_ROOT)/%.cpp | m4-libraries
	@mkdir -p $(@D)
	$(M4_CXX) $(M4_CXXFLAGS) -w $(M4_LIB_INCLUDES) -c $< -o $@

$(M4_LIB_DIR)/libtflm.a: $(M4_LIB_OBJS)
	rm -f $@ && arm-none-eabi-ar rcs $@ $^

# Host test of tflm/int16_kernels.h against the library's reference kernels (header-only).
$(BUILD)/test_int16_kernels: test/test_int16_kernels.cpp tflm/int16_kernels.h tflm/dot_s16_s8.h | m4-libraries
	mkdir -p $(@D)
	$(CXX) -std=c++17 -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined -I. \
	  $(subst -I,-isystem ,$(M4_LIB_INCLUDES)) -o $@ $<
int16-kernels-test: $(BUILD)/test_int16_kernels
	$(BUILD)/test_int16_kernels

$(M4_KEY):
	mkdir -p $(@D) && cd .. && $(abspath $(PYTHON)) -m training keygen --out $(abspath $(@D)) >/dev/null

# Per model: generated constants, the factory image, the node and the board layer.
define M4_MODEL_RULES
$(M4_BUILD)/$(1)/src/model_constants.h: $(M4_MODEL_ROOT)/$(1)/manifest.json $(M4_MODEL_ROOT)/$(1)/model_int8.tflite $(M4_KEY) \
    ../training/firmware_constants.py ../tesla_gateway/ota/descriptor.py
	cd .. && $(abspath $(PYTHON)) -m training firmware-constants --model $(M4_MODEL_ROOT)/$(1) \
	  --out $(abspath $(M4_BUILD))/$(1)/src/model_constants.h --public-key $(abspath $(M4_KEY)) \
	  --model-data $(abspath $(M4_BUILD))/$(1)/model_data.cpp
$(M4_BUILD)/$(1)/$(KERNELS)/%.o: m4/%.cpp m4/*.h tflm/*.h $(M4_BUILD)/$(1)/src/model_constants.h
	@mkdir -p $$(@D)
	$(M4_CXX) $(M4_CXXFLAGS) $(WARN) -Wno-conversion -I$(M4_BUILD)/$(1) -I. -Im4 $(subst -I,-isystem ,$(M4_LIB_INCLUDES)) -c $$< -o $$@
$(M4_BUILD)/$(1)/$(KERNELS)/tflm/%.o: tflm/%.cpp tflm/*.h $(M4_BUILD)/$(1)/src/model_constants.h
	@mkdir -p $$(@D)
	$(M4_CXX) $(M4_CXXFLAGS) $(WARN) -Wno-conversion -I$(M4_BUILD)/$(1) -I. $(subst -I,-isystem ,$(M4_LIB_INCLUDES)) -c $$< -o $$@
$(M4_BUILD)/$(1)/$(KERNELS)/core/%.o: src/%.cpp src/*.h
	@mkdir -p $$(@D)
	$(M4_CXX) $(M4_CXXFLAGS) $(WARN) -c $$< -o $$@
$(M4_BUILD)/$(1)/$(KERNELS)/model_data.o: $(M4_BUILD)/$(1)/src/model_constants.h
	$(M4_CXX) $(M4_CXXFLAGS) -c $(M4_BUILD)/$(1)/model_data.cpp -o $$@
$(M4_BUILD)/$(1)/node-$(KERNELS).elf: $(addprefix $(M4_BUILD)/$(1)/$(KERNELS)/,$(addsuffix .o,$(M4_BOARD)) model_data.o tflm/device_op_resolver.o tflm/model_runner.o) \
    $(patsubst src/%.cpp,$(M4_BUILD)/$(1)/$(KERNELS)/core/%.o,$(CORE)) $(M4_LIB_DIR)/libtflm.a m4/mps2_an386.ld \
    $(M4_BUILD)/$(1)/src/model_constants.h
	$(M4_CXX) $(M4_LDFLAGS) -Wl,-Map=$$(@:.elf=.map) -o $$@ $$(filter %.o %.a,$$^) \
	  -Wl,--defsym=__slot_region_base=$$$$(sed -n 's/.*kSlotRegionBase = \([0-9]*\)u.*/\1/p' $(M4_BUILD)/$(1)/src/model_constants.h)
m4: $(M4_BUILD)/$(1)/node-$(KERNELS).elf
endef
$(foreach m,$(M4_MODELS),$(eval $(call M4_MODEL_RULES,$(m))))

# Instructions per inference (qemu -icount), flash and RAM of both models and both kernel builds
# into ../docs/benchmarks/node-m4/results.json (the README there explains the figures).
m4-bench:
	cd .. && PYTHONPATH=$(abspath ..) $(abspath $(PYTHON)) firmware/m4/bench.py $(M4_BENCH_MODELS)

# What an enclosure's warm, dry air does to the covariate model, on its test sensor's windows
# (docs/benchmarks/node-m4/enclosure.json; LiteRT on the host, no qemu).
m4-enclosure:
	cd .. && PYTHONPATH=$(abspath ..) $(abspath $(PYTHON)) firmware/m4/enclosure.py

# The paper's Figure 8 on the emulated node: trains and exports a short-training TESLA for each
# N (15, 60, 360, 720, 1440; minutes each), measures it, writes docs/benchmarks/node-m4/figure8.
m4-sweep:
	cd .. && PYTHONPATH=$(abspath ..) $(abspath $(PYTHON)) firmware/m4/sweep.py $(SWEEP_WINDOWS)
