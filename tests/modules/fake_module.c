/* SPDX-License-Identifier: MIT */
/*
 * fake_module.c -- a store module that libdlock must refuse: built with
 * FAKE_ABI and FAKE_VERSION other than its own (or with FAKE_NO_ENTRY, no
 * entry at all), installed by test_modules.sh as redis.so in a module
 * directory of its own.
 */
#include "backend.h"

#ifdef FAKE_NO_ENTRY
DLOCK__HOST int fake_module_is_not_a_dlock_module(void);
int fake_module_is_not_a_dlock_module(void)
{
    return 1;
}
#else
DLOCK__HOST extern const dlock__module dlock__module_entry;
const dlock__module dlock__module_entry = {FAKE_ABI, FAKE_VERSION, NULL};
#endif
