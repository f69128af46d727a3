// A layering check fixture: a tool using a private header.
#include "core/strings.h"
