# backend/cuda/cuda.cmake — the CUDA backend: its kernel layer (loom_cuda_ops), the backend
# table on top of it (loom_backend_cuda; and as the module libloom_backend_cuda.so that
# backend/backends.c loads for "cuda"), its gpu tests (ctest label `gpu`, skipped with exit
# status 77 where no device is present) and benchmarks. Built whenever nvcc is found (LOOM_CUDA_KERNELS=OFF
# opts out); a build without nvcc is unchanged and has the CPU backend only. (The
# top-level option LOOM_CUDA is not used: option() stores its AUTO default as the boolean
# OFF.)
#
# The CUDA runtime is linked statically: it loads the driver (libcuda.so.1) at the first
# CUDA call, so the module loads on a machine without a GPU or driver and simply finds no
# cuda device there. cuBLAS/cuBLASLt are shared libraries of the toolkit, needed by the
# module only.
#
# The gpu test and bench binaries link no service library (libpq, libsodium, h2o): they run
# on a GPU machine that lacks them (bench/cuda/make_carry.sh, run_on_gpu.sh).

option(LOOM_CUDA_KERNELS "Build the CUDA kernel layer when nvcc is found" ON)
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER OR NOT LOOM_CUDA_KERNELS)
  message(STATUS "Loom: CUDA kernel layer off (no nvcc, or LOOM_CUDA_KERNELS=OFF)")
  return()
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
message(STATUS "Loom: CUDA kernel layer on (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")

# Hopper: sm_90a machine code (wgmma/setmaxnreg available to tuned kernels) and plain sm_90.
set(LOOM_CUDA_GENCODE "-gencode=arch=compute_90a,code=sm_90a;-gencode=arch=compute_90,code=sm_90"
    CACHE STRING "nvcc -gencode flags for the CUDA kernel layer")

file(GLOB LOOM_CUDA_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/backend/cuda/*.cu)
add_library(loom_cuda_ops STATIC ${LOOM_CUDA_SRC})
# The directory's C warning flags (-Wall ... -D_GNU_SOURCE) mean nothing to nvcc: start from
# an empty list and give nvcc its own. Architectures come from LOOM_CUDA_GENCODE alone.
set_target_properties(loom_cuda_ops PROPERTIES
  COMPILE_OPTIONS ""
  CUDA_ARCHITECTURES OFF
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  POSITION_INDEPENDENT_CODE ON)
target_compile_options(loom_cuda_ops PRIVATE ${LOOM_CUDA_GENCODE} -lineinfo -Xcompiler=-Wall,-Wextra)
target_include_directories(loom_cuda_ops PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(loom_cuda_ops PUBLIC CUDA::cudart_static CUDA::cublasLt CUDA::cublas)

# cuDNN's fused attention (backend/cuda/lcu_cudnn*.c, plain C; its kernel lcu_cudnn_prep.cu is
# in loom_cuda_ops): compiled against cuDNN's headers when they sit with the toolkit's,
# never linked against libcudnn, which it loads at run time (lcu_cudnn.c says where from).
# Without the headers the same entry points say "built without cuDNN" and callers keep the
# own attention kernels.
find_path(LOOM_CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
file(GLOB LOOM_CUDA_DNN_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/backend/cuda/lcu_*.c)
add_library(loom_cuda_dnn STATIC ${LOOM_CUDA_DNN_SRC})
target_link_libraries(loom_cuda_dnn PUBLIC loom_cuda_ops Threads::Threads ${CMAKE_DL_LIBS})
if(LOOM_CUDNN_INCLUDE_DIR)
  target_compile_definitions(loom_cuda_dnn PRIVATE LOOM_HAVE_CUDNN_H)
  target_include_directories(loom_cuda_dnn PRIVATE ${LOOM_CUDNN_INCLUDE_DIR})
  message(STATUS "Loom: cuDNN attention built (headers: ${LOOM_CUDNN_INCLUDE_DIR}; libcudnn loaded at run time)")
else()
  message(STATUS "Loom: cuDNN attention not built (no cudnn_graph.h with the CUDA toolkit)")
endif()

# The backend table (backend/cuda/cuda_*.c, plain C over the kernel layer), linked into
# loom_backends: `loom executor --backend cuda --device N`.
file(GLOB LOOM_CUDA_BACKEND_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/backend/cuda/cuda_*.c)
add_library(loom_backend_cuda STATIC ${LOOM_CUDA_BACKEND_SRC})
target_link_libraries(loom_backend_cuda PUBLIC loom_cuda_ops loom_cuda_dnn loom_backend)
# ... and as the module backend/backends.c loads on first use (libloom_backend_cuda.so,
# next to the binaries in the build directory, lib/loom when installed): the loom binary
# itself links no CUDA library, so it (and its Debian package) runs where none is
# installed. Not part of the Debian package (cuBLAS is no Debian package): installed by
# `cmake --install` as the component `cuda`.
add_library(loom_backend_cuda_module MODULE ${LOOM_CUDA_BACKEND_SRC})
target_link_libraries(loom_backend_cuda_module PRIVATE loom_cuda_ops loom_cuda_dnn loom_backend)
set_target_properties(loom_backend_cuda_module PROPERTIES OUTPUT_NAME loom_backend_cuda
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
add_dependencies(loom loom_backend_cuda_module)
install(TARGETS loom_backend_cuda_module LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/loom COMPONENT cuda)

# The gpu test harness (tests/gpu/gt.h).
add_library(loom_gpu_gt STATIC ${CMAKE_SOURCE_DIR}/tests/gpu/gt.c)
target_include_directories(loom_gpu_gt PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(loom_gpu_gt PUBLIC loom_cuda_ops loom_cuda_dnn m)

# CPU-backend twins the kernel tests compare against: the CPU kernels themselves, built
# with a plain sgemm (tests/gpu/ref_blas.c) instead of OpenBLAS; and the fp64 attention
# reference (tests/gpu/attn_ref.c).
set(LOOM_CPU_TWIN_DIR ${CMAKE_SOURCE_DIR}/backend/cpu)
set(LOOM_EXE_TWIN_DIR ${CMAKE_SOURCE_DIR}/backend)
add_library(loom_gpu_test_support STATIC
  ${CMAKE_SOURCE_DIR}/tests/gpu/ref_blas.c
  ${CMAKE_SOURCE_DIR}/tests/gpu/attn_ref.c
  ${LOOM_CPU_TWIN_DIR}/cpu_ops.c
  ${LOOM_CPU_TWIN_DIR}/cpu_gemm.c
  ${LOOM_CPU_TWIN_DIR}/cpu_pool.c
  ${LOOM_CPU_TWIN_DIR}/cpu_attention.c
  ${LOOM_CPU_TWIN_DIR}/cpu_choose.c
  ${LOOM_EXE_TWIN_DIR}/sample_pick.c
  ${LOOM_EXE_TWIN_DIR}/adamw.c
  ${CMAKE_SOURCE_DIR}/contract/contract.c)
target_include_directories(loom_gpu_test_support PUBLIC ${CMAKE_SOURCE_DIR} ${OPENBLAS_INCLUDE_DIRS})
target_link_libraries(loom_gpu_test_support PUBLIC loom_gpu_gt Threads::Threads m)

# Kernel tests link the twins; the backend test (test_gpu_backend) links the real backends
# instead, the CPU one being its reference; test_gpu_check, the backend's error policy.
enable_testing()
file(GLOB LOOM_GPU_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/gpu/test_gpu_*.c)
foreach(src ${LOOM_GPU_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  if(name STREQUAL "test_gpu_backend")
    target_link_libraries(${name} PRIVATE loom_gpu_gt loom_backends loom_model)
  elseif(name STREQUAL "test_gpu_check")
    target_link_libraries(${name} PRIVATE loom_gpu_gt loom_backend_cuda)
  else()
    target_link_libraries(${name} PRIVATE loom_gpu_test_support)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()

# The cuDNN attention's host side (loader, graphs, plan cache) against a stand-in libcudnn:
# runs without a GPU or cuDNN, so it is no `gpu` test.
if(LOOM_CUDNN_INCLUDE_DIR)
  add_library(cudnn_shim SHARED ${CMAKE_SOURCE_DIR}/tests/cudnn_shim/cudnn_shim.c)
  target_include_directories(cudnn_shim PRIVATE ${LOOM_CUDNN_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  add_executable(test_cudnn_graph ${CMAKE_SOURCE_DIR}/tests/gpu/test_cudnn_graph.c)
  target_compile_definitions(test_cudnn_graph PRIVATE LOOM_HAVE_CUDNN_H)
  target_include_directories(test_cudnn_graph PRIVATE ${LOOM_CUDNN_INCLUDE_DIR})
  target_link_libraries(test_cudnn_graph PRIVATE loom_cuda_dnn m)
  add_dependencies(test_cudnn_graph cudnn_shim)
  add_test(NAME test_cudnn_graph COMMAND test_cudnn_graph $<TARGET_FILE:cudnn_shim>)
  set_tests_properties(test_cudnn_graph PROPERTIES TIMEOUT 120)

  # The same graphs against the real libcudnn where one is installed (skipped, 77, where
  # none is), planned for an H100 without a GPU. The toolkit's stub driver as libcuda.so.1,
  # first on the path, lets cuDNN's engines compile their kernels for the graphs (only
  # loading them fails): see the test's comment.
  add_executable(test_cudnn_plans ${CMAKE_SOURCE_DIR}/tests/gpu/test_cudnn_plans.c)
  target_compile_definitions(test_cudnn_plans PRIVATE LOOM_HAVE_CUDNN_H)
  target_include_directories(test_cudnn_plans PRIVATE ${LOOM_CUDNN_INCLUDE_DIR})
  target_link_libraries(test_cudnn_plans PRIVATE loom_cuda_dnn m)
  add_test(NAME test_cudnn_plans COMMAND test_cudnn_plans)
  set_tests_properties(test_cudnn_plans PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
  find_file(LOOM_CUDA_STUB_DRIVER libcuda.so PATHS ${CUDAToolkit_LIBRARY_DIR}/stubs NO_DEFAULT_PATH)
  if(LOOM_CUDA_STUB_DRIVER)
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/cuda-stub)
    file(CREATE_LINK ${LOOM_CUDA_STUB_DRIVER} ${CMAKE_BINARY_DIR}/cuda-stub/libcuda.so.1 SYMBOLIC)
    set_tests_properties(test_cudnn_plans PROPERTIES
                         ENVIRONMENT "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/cuda-stub:${CUDAToolkit_LIBRARY_DIR}")
  endif()
endif()

# The backend suites of tests/ (tests.cmake builds them) once more on the cuda backend;
# tests/lib/test_backend.h exits 77 (skipped) where the backend has no device.
foreach(name test_cpu_ref test_learning test_longseq test_exe_sample)
  add_test(NAME ${name}_cuda COMMAND ${name})
  set_tests_properties(${name}_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 900
                       ENVIRONMENT "LOOM_TEST_BACKEND=cuda;LOOM_BIN=$<TARGET_FILE:loom>")
endforeach()
add_test(NAME reference_torch_cuda COMMAND ${LOOM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/ref/run_ref.py
         --dump-bin $<TARGET_FILE:test_cpu_ref> --work ${CMAKE_BINARY_DIR}/ref-work-cuda --tolerance bf16)
set_tests_properties(reference_torch_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 900
                     ENVIRONMENT "LOOM_TEST_BACKEND=cuda;PYTHONUNBUFFERED=1")

# Benchmarks (kernels; one layer extrapolated to the model; the model through the backend
# table): print figures, never tests.
foreach(b bench_cuda_kernels bench_cuda_layer)
  add_executable(${b} ${CMAKE_SOURCE_DIR}/bench/cuda/${b}.c)
  target_link_libraries(${b} PRIVATE loom_gpu_test_support)
endforeach()
add_executable(bench_cuda ${CMAKE_SOURCE_DIR}/bench/cuda/bench_cuda.c)
target_link_libraries(bench_cuda PRIVATE loom_backends loom_model)
