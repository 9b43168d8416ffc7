# console/console.cmake: the web console's files (console/*.html, *.js, *.css, *.svg)
# compiled into loom_console, so that `loom api` serves them with no files at run time
# and no network (included by the top-level CMakeLists.txt after loom_console).
file(GLOB LOOM_CONSOLE_FILES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/console/*.html ${CMAKE_SOURCE_DIR}/console/*.js
     ${CMAKE_SOURCE_DIR}/console/*.css ${CMAKE_SOURCE_DIR}/console/*.svg)
set(LOOM_CONSOLE_C ${CMAKE_BINARY_DIR}/console_embedded.c)
add_custom_command(
  OUTPUT ${LOOM_CONSOLE_C}
  COMMAND ${CMAKE_COMMAND} -DOUT=${LOOM_CONSOLE_C} -DSRC_DIR=${CMAKE_SOURCE_DIR}/console
          -P ${CMAKE_SOURCE_DIR}/console/embed.cmake
  DEPENDS ${LOOM_CONSOLE_FILES} ${CMAKE_SOURCE_DIR}/console/embed.cmake
  COMMENT "Embedding the web console")
target_sources(loom_console PRIVATE ${LOOM_CONSOLE_C})
