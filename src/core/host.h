/* SPDX-License-Identifier: MIT */
/*
 * host.h -- what the core lends to store modules.
 *
 * A store built as a module (src/stores/<store>/, loaded by registry.c)
 * calls into libdlock only through the functions declared with DLOCK__HOST:
 * the module ABI's functions, exported by the shared library under the
 * symbol version DLOCK_PRIVATE_<version> (cmake/dlock.map.in), so that a
 * module of another dlock version fails to load instead of calling a
 * function whose contract changed. Everything else in the core stays hidden.
 * Adding a function here is adding to the module ABI: say why where it is
 * declared.
 */
#ifndef DLOCK_HOST_H
#define DLOCK_HOST_H

#define DLOCK__HOST __attribute__((visibility("default")))

#endif /* DLOCK_HOST_H */
