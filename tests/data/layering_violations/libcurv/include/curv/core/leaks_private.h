// A layering check fixture: a public header using a private one.
#pragma once
#include "core/strings.h"
