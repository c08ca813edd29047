# SPDX-License-Identifier: MIT
# Included after project() (debian/rules: CMAKE_PROJECT_INCLUDE). A
# workaround, to go once the PostgreSQL store is fixed: its statement
# formats (src/stores/pg/pg_sql.c, sql_of()) use positional arguments
# with gaps (%1$s, %3$s, %9$s, not %4$s..%8$s), which POSIX leaves
# undefined and glibc's _FORTIFY_SOURCE, which Debian's build flags set,
# stops with "*** invalid %N$ use detected ***" when a client opens a
# postgres:// URI. Only the store's objects (pg.so, its part of
# libdlock.a) are built without it; everything else keeps it.
cmake_language(DEFER CALL dlock_deb_pg_nofortify)
function(dlock_deb_pg_nofortify)
  if(TARGET dlock_store_pg)
    set_property(TARGET dlock_store_pg APPEND PROPERTY COMPILE_OPTIONS -U_FORTIFY_SOURCE)
    message(STATUS "dlock (Debian): the postgres store is built without _FORTIFY_SOURCE")
  endif()
endfunction()
