//! Quantized block formats: layouts, reference dequantization and reference quantization.
