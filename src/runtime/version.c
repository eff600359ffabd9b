/*
 * version.c - the library's version: QWENC_VERSION of include/qwenc.h, the one place it is written.
 */
#include "qwenc.h"

const char *qwenc_version(void) { return QWENC_VERSION; }
