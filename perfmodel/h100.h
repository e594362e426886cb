// Every figure of the H100 step-time model in one place, each with its source, so a calibration
// run on a real GPU (the lab's GPU check, lab/gpulab) changes numbers here and nowhere else.
// Datasheet figures are NVIDIA's "H100 Tensor Core GPU" datasheet, SXM column; per-SM limits are
// the CUDA C++ Programming Guide's table for compute capability 9.0 and CUDA 13's
// cuda_occupancy.h. Figures marked "assumption" are this model's own and are what the first GPU
// run should calibrate.
#pragma once

namespace minidl::gpumodel {

struct H100Spec {
  // ---- the chip ----
  const char* name = "H100 SXM5 80GB (modelled)";
  int sms = 132;   // datasheet / H100 whitepaper: 132 SMs on the SXM5 part
  // The clock the datasheet's peaks imply: 989.5 TFLOPS / (132 SMs x 4096 f16 FLOP per clock).
  double clock_hz = 1.83e9;
  int shared_bytes_per_clock = 128;   // 32 banks of 4 bytes: one shared-memory wavefront per clock per SM

  // ---- memory ----
  double hbm_bytes_per_s = 3.35e12;   // datasheet: GPU memory bandwidth 3.35 TB/s (HBM3)
  double hbm_efficiency = 0.90;       // assumption: a streaming kernel reaches ~90% of the pin bandwidth
  double l2_bytes = 50e6;             // whitepaper: 50 MB L2 cache
  // Assumption: L2 -> SM bandwidth, of the order microbenchmarks report (Chips and Cheese, H100 PCIe).
  double l2_bytes_per_s = 5.5e12;
  // Assumption: a streaming kernel needs about half of an SM's 64 warp slots resident, on every SM,
  // to keep HBM busy (Little's law: ~3 TB/s x ~0.6 us of latency in flight); a launch with fewer
  // resident warps gets a proportional share of the bandwidth.
  int warps_to_saturate_hbm_per_sm = 32;
  double pcie_bytes_per_s = 64e9;   // datasheet: PCIe Gen5 128 GB/s, both directions together

  // ---- dense peaks (the datasheet's tensor figures are "with sparsity": dense is half) ----
  double f16_tensor_flops = 989.5e12;    // datasheet: FP16 / BF16 Tensor Core 1,979 TFLOPS with sparsity
  double tf32_tensor_flops = 494.5e12;   // datasheet: TF32 Tensor Core 989 TFLOPS with sparsity
  double fp32_flops = 67e12;             // datasheet: FP32 67 TFLOPS
  double fp64_flops = 34e12;             // datasheet: FP64 34 TFLOPS (cuDNN's f64 runs on CUDA cores)

  // ---- what the libraries reach (assumptions, to calibrate) ----
  double cudnn_efficiency = 0.60;    // assumption: cuDNN convolutions at 60% of the math's dense peak
  double cublas_efficiency = 0.70;   // assumption: cuBLAS GEMMs at 70% of the math's dense peak
  // Measured: cuDNN's f16 convolutions on NCHW tensors take this many times what the same calls take
  // channels-last. An H200 (the H100's SMs, faster memory), gated launch timing, ResNet-50
  // AMP batch 256, autotuned: 158 calls, 29.45 ms NCHW against 14.37 ms channels-last (forward 2.01x,
  // backward data 2.00x, backward filter 2.14x; lab/results/bench/gpu_check_2026-11-26_ab67ceb.md). The
  // channels-last calls measured within 3-12% of cudnn_efficiency's figure, so the efficiency prices
  // cuDNN's NHWC tensor-core kernels and this factor the NCHW ones (which rearrange their operands).
  // f32 and f64 convolutions were not measured either way: they keep the plain efficiency.
  double cudnn_f16_nchw_factor = 2.05;

  // ---- launches ----
  // Assumption: one eager launch, the runtime's and minidl's host-side dispatch; HolisticTraceAnalysis's
  // documentation puts PyTorch's CPU-side launch (Python included) at 5-20 us.
  double launch_eager_s = 4.0e-6;
  // Assumption: one kernel node replayed in a CUDA graph, about a microsecond, the order NVIDIA's
  // CUDA Graphs posts report for short kernels.
  double launch_graph_s = 1.0e-6;

  // ---- per SM and per block (CUDA guide, cc 9.0; cuda_occupancy.h) ----
  int regs_per_sm = 65536;            // 64K 32-bit registers per SM
  int max_regs_per_thread = 255;
  int reg_alloc_unit = 256;           // cuda_occupancy.h: registers are allocated per warp in units of 256
  int reg_sub_partitions = 4;         // cuda_occupancy.h: 4 sub-partitions share the register file equally
  int max_threads_per_sm = 2048;      // 2048 threads = 64 warps per SM
  int max_warps_per_sm = 64;
  int max_blocks_per_sm = 32;
  int max_threads_per_block = 1024;
  int smem_per_sm = 233472;           // 228 KiB of shared memory per SM
  int smem_per_block_default = 49152;   // 48 KiB per block without cudaFuncSetAttribute's opt-in
  int smem_per_block_optin = 232448;    // 227 KiB per block with the opt-in
  int smem_reserved_per_block = 1024;   // 1 KiB per block reserved by the driver (cc 8.0 and later)
  int smem_alloc_unit = 128;            // cuda_occupancy.h: shared memory in 128-byte units on cc 8.x / 9.x
  int warp_size = 32;
};

// The H200 SXM: the H100's processor (the same 132 SMs and the same dense tensor and FP32 peaks by
// NVIDIA's H200 datasheet) with 141 GB of HBM3e at 4.8 TB/s. The GPU sessions are lent either chip,
// and a measurement is compared with the model of the chip it ran on (minidl-gpumodel --gpu h200).
// Every assumption stays the H100's until an H200 calibrates it.
inline H100Spec h200_spec() {
  H100Spec s;
  s.name = "H200 SXM 141GB (modelled)";
  s.hbm_bytes_per_s = 4.8e12;   // datasheet: GPU memory bandwidth 4.8 TB/s (HBM3e)
  return s;
}

}  // namespace minidl::gpumodel
