// A library message that names a tool's flag instead of the option.
#include <stdexcept>

void refuse() { throw std::runtime_error("give --data FILE"); }
