# Test registration. C tests: tests/test_*.c, one executable each, print "N passed, N failed"
# (tests/check.h; dbtest.h starts a private PostgreSQL, regtest.h races saves against GC).
# Python tests: tests/*_test.py and tests/ref/run_ref.py, run with Debian's /usr/bin/python3
# (it sees python3-torch/numpy), each starting its own PostgreSQL where it needs one.
set(LOOM_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch and numpy for tests")

file(GLOB LOOM_C_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/test_*.c)
foreach(src ${LOOM_C_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE loom_api loom_scheduler loom_executor loom_backend loom_model
                        loom_text loom_registry loom_contract loom_common)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "LOOM_BIN=$<TARGET_FILE:loom>" TIMEOUT 600)
endforeach()

file(GLOB LOOM_PY_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*_test.py)
foreach(src ${LOOM_PY_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME ${name} COMMAND ${LOOM_PYTHON} ${src})
  set_tests_properties(${name} PROPERTIES
    ENVIRONMENT "LOOM_BIN=$<TARGET_FILE:loom>;PYTHONUNBUFFERED=1" TIMEOUT 900)
endforeach()

if(EXISTS ${CMAKE_SOURCE_DIR}/tests/ref/run_ref.py)
  add_test(NAME reference_torch COMMAND ${LOOM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/ref/run_ref.py
           --loom-bin $<TARGET_FILE:loom> --dump-bin $<TARGET_FILE:test_cpu_ref>
           --work ${CMAKE_BINARY_DIR}/ref-work)
  set_tests_properties(reference_torch PROPERTIES ENVIRONMENT "PYTHONUNBUFFERED=1" TIMEOUT 900)
endif()

# The executor's NVML reading against a stand-in library (no GPU needed).
add_library(nvml_shim MODULE ${CMAKE_SOURCE_DIR}/tests/nvml_shim/nvml_shim.c)
set_tests_properties(test_exe_gpu PROPERTIES ENVIRONMENT "LOOM_NVML_LIBRARY=$<TARGET_FILE:nvml_shim>")
add_dependencies(test_exe_gpu nvml_shim)
# Needs root (mmdebstrap, chroot, mount): skipped (77) elsewhere.
if(EXISTS ${CMAKE_SOURCE_DIR}/tests/deb_test.py)
  set_tests_properties(deb_test PROPERTIES SKIP_RETURN_CODE 77)
endif()
# The simulated GPU (backend/sim/) on the backend suites it is held to: batch invariance
# (its replays are exact) and the executor's sampling. Not the reference or learning
# suites: its tiny model of its own is not the CPU backend's (tests/sim_test.py drives it
# through the whole stack).
foreach(name test_batch_invariance test_exe_sample)
  add_test(NAME ${name}_sim COMMAND ${name})
  set_tests_properties(${name}_sim PROPERTIES ENVIRONMENT "LOOM_TEST_BACKEND=sim;LOOM_BIN=$<TARGET_FILE:loom>" TIMEOUT 600)
endforeach()
