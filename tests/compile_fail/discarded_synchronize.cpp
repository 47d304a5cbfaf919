// Must not compile (warnings as errors): a synchronize() whose pending is dropped waits for
// nothing. pending is [[nodiscard]].
#include <cora/cora.hpp>

void f(cora::stream& s) { s.synchronize(); }
