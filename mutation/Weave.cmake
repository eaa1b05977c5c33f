# The woven build of OpenReg (docs/mutation-testing.md): included at the end
# of reference_backend/CMakeLists.txt when OPENREG_WEAVE names this file
# (`make build` does). Every source file of OpenReg's targets that has sites
# in conformance/mutants.toml is compiled from a woven copy in the build tree
# (mutation/weave.py) instead of the clean file; the other files compile as
# they are. Without OPENREG_WEAVE nothing here runs: a clean build.

set(_weave_dir "${CMAKE_CURRENT_LIST_DIR}")
get_filename_component(_weave_root "${_weave_dir}/.." ABSOLUTE)
set(_weave_registry "${_weave_root}/conformance/mutants.toml")
set(_weave_tool "${_weave_dir}/weave.py")
set(_weave_out "${CMAKE_BINARY_DIR}/woven")

# A new file with sites (or one without any more) changes which sources are
# woven: configure again when the registry changes.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_weave_registry}" "${_weave_tool}")
execute_process(
  COMMAND "${Python_EXECUTABLE}" "${_weave_tool}" --registry "${_weave_registry}" --root "${_weave_root}" --list
  OUTPUT_VARIABLE _weave_files RESULT_VARIABLE _weave_status)
if(NOT _weave_status EQUAL 0)
  message(FATAL_ERROR "mutation/weave.py could not read ${_weave_registry}")
endif()
string(REPLACE "\n" ";" _weave_files "${_weave_files}")

set(_weave_outputs)
foreach(_target openreg_runtime openreg_torch openreg_torch_kernels openreg_C openreg-executor)
  get_target_property(_sources ${_target} SOURCES)
  get_target_property(_source_dir ${_target} SOURCE_DIR)
  set(_woven_sources)
  set(_any FALSE)
  foreach(_source IN LISTS _sources)
    get_filename_component(_path "${_source}" ABSOLUTE BASE_DIR "${_source_dir}")
    file(RELATIVE_PATH _relative "${_weave_root}" "${_path}")
    if(_relative IN_LIST _weave_files)
      set(_woven "${_weave_out}/${_relative}")
      get_filename_component(_clean_dir "${_path}" DIRECTORY)
      add_custom_command(
        OUTPUT "${_woven}"
        COMMAND "${Python_EXECUTABLE}" "${_weave_tool}" --registry "${_weave_registry}" --root "${_weave_root}"
                --source "${_path}" --output "${_woven}"
        DEPENDS "${_path}" "${_weave_registry}" "${_weave_tool}"
        COMMENT "Weaving the mutants of ${_relative}")
      # The woven copy includes its clean neighbours ("Foo.h") as the clean file would.
      set_source_files_properties("${_woven}" TARGET_DIRECTORY ${_target}
                                  PROPERTIES GENERATED TRUE INCLUDE_DIRECTORIES "${_clean_dir}")
      list(APPEND _woven_sources "${_woven}")
      list(APPEND _weave_outputs "${_woven}")
      set(_any TRUE)
    else()
      list(APPEND _woven_sources "${_path}")
    endif()
  endforeach()
  if(_any)
    # The selection (OPENREG_MUTANT) the woven sites read.
    list(APPEND _woven_sources "${_weave_dir}/selection.cpp")
    set_property(TARGET ${_target} PROPERTY SOURCES "${_woven_sources}")
    list(APPEND _weave_targets ${_target})
  endif()
endforeach()

if(_weave_outputs)
  add_custom_target(openreg_woven_sources DEPENDS ${_weave_outputs})
  foreach(_target IN LISTS _weave_targets)
    add_dependencies(${_target} openreg_woven_sources)
  endforeach()
endif()
message(STATUS "OpenReg: mutants woven into ${_weave_files}")
