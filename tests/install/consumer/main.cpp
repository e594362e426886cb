// The smallest program a user of the installed minidl writes: two tensors, their sum, a check.
// It proves that the installed headers are complete and that minidl::core links and runs, alone:
// without minidl::cuda the program has no CUDA backend, and asking for one says what to link.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <minidl/core/backend.h>
#include <minidl/core/error.h>
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
  if (minidl::cuda_built()) {
    std::cerr << "minidl consumer: FAILED: a program linking minidl::core only has a CUDA backend\n";
    return 1;
  }
  try {
    minidl::backend(minidl::DeviceType::CUDA);
    std::cerr << "minidl consumer: FAILED: backend(CUDA) did not throw without minidl::cuda\n";
    return 1;
  } catch (const minidl::Error& e) {
    if (std::string(e.what()).find("Link minidl::cuda") == std::string::npos) {
      std::cerr << "minidl consumer: FAILED: backend(CUDA) says " << e.what() << "\n";
      return 1;
    }
  }
  std::printf("minidl consumer: OK\n");
  return 0;
}
