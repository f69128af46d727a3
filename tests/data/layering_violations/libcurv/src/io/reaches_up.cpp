// A layering check fixture: io reaching up into analysis.
#include <curv/analysis/report.h>
