// The comparison harness itself: a backend compared with an equal one agrees
// exactly, and the report names what it compared.
#include "backend/compare.h"

#include <gtest/gtest.h>

#include <sstream>

#include "core/error.h"

namespace amsp::backend {
namespace {

TEST(BackendCompare, TheCpuBackendAgainstItselfIsExact) {
  for (DType compute : {DType::kF32, DType::kBF16}) {
    auto a = make_cpu_backend(compute), b = make_cpu_backend(compute);
    const CompareReport report = compare_backends(*a, *b);
    EXPECT_TRUE(report.ok());
    EXPECT_GT(report.rows.size(), 100u);
    for (const CompareRow& r : report.rows) EXPECT_EQ(r.error, 0) << r.kernel << " " << r.shape;
    std::ostringstream out;
    print_report(report, out);
    EXPECT_NE(out.str().find("attention_forward+backward"), std::string::npos) << out.str();
    EXPECT_NE(out.str().find("all within tolerance"), std::string::npos) << out.str();
  }
}

TEST(BackendCompare, BackendsMustComputeInOneDtype) {
  auto a = make_cpu_backend(DType::kF32), b = make_cpu_backend(DType::kBF16);
  EXPECT_THROW(compare_backends(*a, *b), Error);
}

}  // namespace
}  // namespace amsp::backend
