// The smallest program a user of the installed minidl writes: two tensors, their sum, a check.
// It proves that the installed headers are complete and that minidl::core links and runs.
#include <cstdio>
#include <iostream>
#include <vector>

#include <minidl/core/ops.h>
#include <minidl/core/tensor.h>

int main() {
  const minidl::Tensor a = minidl::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  const minidl::Tensor b = minidl::from_vector({10, 20, 30, 40, 50, 60}, {2, 3});
  const minidl::Tensor c = a + b;
  std::cout << c << "\n";

  const std::vector<double> want{11, 22, 33, 44, 55, 66};
  if (c.shape() != minidl::Shape{2, 3} || c.to_vector() != want) {
    std::cerr << "minidl consumer: FAILED: a + b = " << c.str() << "\n";
    return 1;
  }
  std::printf("minidl consumer: OK\n");
  return 0;
}
