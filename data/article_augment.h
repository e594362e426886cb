// The offline augmentation of the Keras batch-size article ("How to maximize GPU utilization by
// finding the right batch size"): before training it saved every training and validation photo
// twice, as Keras loaded it and as the top-left corner of its 250x250 upscale, so both sets double
// and stay the same every epoch. Emulated as a dataset view, so the loader needs nothing new.
#pragma once
#include <memory>

#include "data/dataset.h"
#include "data/loader.h"

namespace minidl::data {

// The article's second copy of a loaded size x size image: PIL's Image.resize((r, r)) with its
// default filter (BICUBIC since Pillow 7.0, NEAREST before; docs/data.md), r = round(size * 250 /
// 200), then crop((0, 0, size, size)), its top-left size x size corner.
Image article_crop(const Image& loaded);

// A view of `base` with twice its samples: sample i < n is base sample i as `load` makes it (an
// evaluation transform, Augment::None: e.g. Keras' load_img nearest squash to size x size), sample
// n + i is article_crop of that image. Labels follow the base; the second copies' describe() and
// key() end in " (article crop)". Throws for an augmenting `load`.
std::shared_ptr<Dataset> article_augmented(std::shared_ptr<const Dataset> base, TransformOptions load);

}  // namespace minidl::data
