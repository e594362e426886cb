// Construction and initialisation of the Keras study's small CNN (see keras_cnn.h).
#include "nn/keras_cnn.h"

#include <cmath>

#include "core/autograd.h"
#include "core/ops.h"
#include "nn/init.h"

namespace minidl::nn {

KerasSmallCnn::KerasSmallCnn(int64_t image_size, Generator* gen) : Module("KerasSmallCnn"), image_size_(image_size) {
  MINIDL_CHECK(image_size >= 2 && image_size % 2 == 0, "KerasSmallCnn: image_size must be even and >= 2 (the ",
               "2x2 max-pool halves it), got ", image_size);
  const int64_t pooled = image_size / 2;
  // Activations are modules too, so summary() shows the bytes each keeps for backward.
  conv_ = register_module("conv", std::make_shared<Conv2d>(3, 32, 3, 1, 1, 1, true, gen));
  pool_ = register_module("pool", std::make_shared<MaxPool2d>(2));
  relu1_ = register_module("relu1", std::make_shared<ReLU>());
  flatten_ = register_module("flatten", std::make_shared<Flatten>());
  fc1_ = register_module("fc1", std::make_shared<Linear>(32 * pooled * pooled, 128, true, gen));
  relu2_ = register_module("relu2", std::make_shared<ReLU>());
  fc2_ = register_module("fc2", std::make_shared<Linear>(128, 1, true, gen));
  // Keras' defaults: glorot_uniform kernels, zero biases. Not he_uniform: SGD's first step moves
  // the logit by about lr x |h|^2 through fc1 (|h|^2 sums 320,000 pooled activations at 200x200),
  // and He's conv gain makes |h|^2 about 12x Glorot's. Measured at lr 0.01, batch 32: the loss of
  // the second or third batch jumps to 45-94 (synthetic) or 34 (photos / 255) with He, to 5-10 and
  // 1.4 with Glorot. SGD at lr 0.01 stays at the edge even so: zero-mean photos then train (60%
  // validation after two epochs), while the 200x200 synthetic set sits at chance after its spike.
  for (const Tensor& w : {conv_->weight(), fc1_->weight(), fc2_->weight()}) init::xavier_uniform_(w, 1.0, gen);
  for (const Tensor& b : {conv_->bias(), fc1_->bias(), fc2_->bias()}) init::constant_(b, 0.0);
}

Tensor KerasSmallCnn::forward(const Tensor& x) {
  MINIDL_CHECK(x.dim() == 4 && x.size(1) == 3 && x.size(2) == image_size_ && x.size(3) == image_size_,
               "KerasSmallCnn: expects images [N, 3, ", image_size_, ", ", image_size_, "] but got ",
               shape_str(x.shape()), "; build the model with image_size=", (x.dim() == 4 ? x.size(2) : 0),
               " or resize the images");
  return (*fc2_)((*relu2_)((*fc1_)((*flatten_)((*relu1_)((*pool_)((*conv_)(x)))))));
}

Tensor KerasSmallCnn::predict(const Tensor& x) { return sigmoid(forward(x)); }

}  // namespace minidl::nn
