/* SPDX-License-Identifier: MIT */
/*
 * module.c -- the entry of sqlite.so, the SQLite store module: what libdlock
 * looks up after loading it (src/core/registry.c). Only in the module: a
 * build with the store built in does not compile this file.
 */
#include "sqlite_int.h"

DLOCK__MODULE(&dlock__backend_sqlite);
