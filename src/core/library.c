/* Library-wide calls of the public API (gemma4c.h): the version, and freeing what the library
 * handed over. */
#include <stdlib.h>

#include "gemma4c.h"

const char *g4_version(void) { return G4_VERSION; }

void g4_free(void *p) { free(p); }
