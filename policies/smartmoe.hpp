// SmartMoE-style expert rearrangement (policy "smartmoe"; see smartmoe.cpp).
#pragma once
#include <vector>

namespace moesim {

/// The balanced placement of one layer's experts over `gpus` GPUs, E/G each: experts in decreasing
/// load, each to the least loaded GPU that still has a free slot; ties go to the GPU with the least
/// `carry` (the earlier layers' load on it; empty: none), then to the lower GPU.
std::vector<int> balanced_placement(const std::vector<double>& load, int gpus, const std::vector<double>& carry = {});

}  // namespace moesim
