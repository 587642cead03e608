// amsp plan --calibrate: the cost model beside the AMSP paper's published MFU.
#pragma once

#include <ostream>

#include "plan/bandwidth.h"

namespace amsp::cli {

// Prints the calibration table (or one JSON object) for `cluster`; returns 0.
int print_calibration(std::ostream& os, const plan::Cluster& cluster, bool json);

}  // namespace amsp::cli
