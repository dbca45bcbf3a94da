// Placeholder: implemented on the generator branch.
#include "generator.hpp"
