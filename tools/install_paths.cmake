# The install steps that need the prefix given at install time
# (`cmake --install build --prefix P` sets CMAKE_INSTALL_PREFIX here; paths
# written into files leave DESTDIR out, as it is only a staging root):
#   - LIBDIR/pkgconfig/attn.pc from attn.pc.in, with P's absolute paths;
#   - the Python packages python/attn and python/molgen (python/pyproject.toml)
#     into the site directory that ATTN_PYTHON searches under P, plus
#     attn/_library_path.txt: the installed libattn's absolute path, which
#     python/attn/_lib.py loads (no ATTN_LIBRARY needed).
# Site directory: ATTN_PYTHON_SITEDIR when set (relative to P, or absolute);
# else ATTN_PYTHON's own default sys.path entry under P (Debian's python3:
# /usr -> lib/python3/dist-packages, /usr/local -> lib/python3.X/dist-packages);
# else P/lib/python3/dist-packages, which then needs PYTHONPATH (said here).
# Inputs, from the install(CODE) in CMakeLists.txt: ATTN_SOURCE_DIR,
# ATTN_BINARY_DIR, ATTN_PYTHON, ATTN_PYTHON_SITEDIR, ATTN_LIBDIR,
# ATTN_INCLUDEDIR, ATTN_LIBRARY_FILE, PROJECT_VERSION.

string(REGEX REPLACE "(.)/+$" "\\1" prefix "${CMAKE_INSTALL_PREFIX}")

function(attn_under_prefix out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "${prefix}/${dir}" PARENT_SCOPE)
  endif()
endfunction()
attn_under_prefix(libdir "${ATTN_LIBDIR}")
attn_under_prefix(includedir "${ATTN_INCLUDEDIR}")

# attn.pc
set(ATTN_PC_PREFIX "${prefix}")
set(ATTN_PC_LIBDIR "${libdir}")
set(ATTN_PC_INCLUDEDIR "${includedir}")
configure_file("${ATTN_SOURCE_DIR}/attn.pc.in" "${ATTN_BINARY_DIR}/attn.pc" @ONLY)
file(INSTALL "${ATTN_BINARY_DIR}/attn.pc" DESTINATION "${libdir}/pkgconfig")

# the Python packages
set(site "")
set(on_path FALSE)
if(ATTN_PYTHON_SITEDIR)
  attn_under_prefix(site "${ATTN_PYTHON_SITEDIR}")
  set(on_path UNKNOWN)
elseif(ATTN_PYTHON AND EXISTS "${ATTN_PYTHON}")
  # the default sys.path, without the caller's PYTHONPATH
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E env --unset=PYTHONPATH --unset=PYTHONHOME
            "${ATTN_PYTHON}" -c "import sys; print('\\n'.join(sys.path))"
    WORKING_DIRECTORY /
    OUTPUT_VARIABLE py_path RESULT_VARIABLE py_rc ERROR_QUIET)
  if(py_rc EQUAL 0 AND NOT prefix STREQUAL "/")
    string(REPLACE "\n" ";" py_path "${py_path}")
    foreach(entry IN LISTS py_path)
      string(FIND "${entry}" "${prefix}/" at)
      if(at EQUAL 0 AND entry MATCHES "/(dist|site)-packages$")
        # Debian puts its own packages in lib/python3/dist-packages: preferred
        if(site STREQUAL "" OR entry MATCHES "/python3/dist-packages$")
          set(site "${entry}")
          set(on_path TRUE)
        endif()
      endif()
    endforeach()
  endif()
endif()
if(site STREQUAL "")
  set(site "${prefix}/lib/python3/dist-packages")
endif()

file(GLOB py_files "${ATTN_SOURCE_DIR}/python/attn/*.py")
file(INSTALL ${py_files} DESTINATION "${site}/attn")
# molgen: its modules and molgen.moses_filters (the module with its SMARTS lists)
file(GLOB py_files "${ATTN_SOURCE_DIR}/python/molgen/*.py")
file(INSTALL ${py_files} "${ATTN_SOURCE_DIR}/python/molgen/moses_filters"
     DESTINATION "${site}/molgen")
# molgen.scoring: its modules, the PMO task TOML files it serves, an example
file(GLOB py_files "${ATTN_SOURCE_DIR}/python/molgen/scoring/*.py")
file(INSTALL ${py_files} "${ATTN_SOURCE_DIR}/python/molgen/scoring/pmo"
     "${ATTN_SOURCE_DIR}/python/molgen/scoring/examples"
     DESTINATION "${site}/molgen/scoring")
file(WRITE "${ATTN_BINARY_DIR}/_library_path.txt" "${libdir}/${ATTN_LIBRARY_FILE}\n")
file(INSTALL "${ATTN_BINARY_DIR}/_library_path.txt" DESTINATION "${site}/attn")

if(on_path STREQUAL "TRUE")
  message(STATUS "Python packages attn, molgen: ${site} (on ${ATTN_PYTHON}'s default path)")
elseif(on_path STREQUAL "UNKNOWN")
  message(STATUS "Python packages attn, molgen: ${site} (ATTN_PYTHON_SITEDIR)")
else()
  message(STATUS "Python packages attn, molgen: ${site}, which ${ATTN_PYTHON} does not search by default: PYTHONPATH=${site}")
endif()
