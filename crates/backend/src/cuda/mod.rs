//! The CUDA backend: device discovery, NVRTC compilation of kernel sources generated with a model's constants (with
//! an on-disk cache of the compiled machine code), device buffers and kernel launches.
//!
//! Everything goes through cudarc with dynamic loading: the binary links no CUDA library, and [`available`] checks
//! for the driver and NVRTC before anything else touches them, so a machine without CUDA never reaches a call that
//! would panic. The runner's kernels live in `kernels.cu` (`crates/models/src/cuda/` drives them); [`CudaBackend`]
//! implements [`crate::Backend`] on `ops.cu`'s.

use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, result as dres};
use cudarc::nvrtc::{Ptx, sys as nsys};
use sha2::{Digest, Sha256};

mod backend;

pub use backend::{CudaBackend, CudaKvPages, CudaMatrix, CudaTensor, CudaVector};

/// The kernel library; the host prepends the model's constants and appends instantiations.
pub const KERNELS: &str = concat!(
    include_str!("prelude.cu"),
    include_str!("kernels.cu"),
    include_str!("flash_attention.cu"),
    include_str!("experts.cu"),
    include_str!("moe.cu")
);

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    #[error("CUDA driver call failed: {0}")]
    Driver(String),
    #[error("NVRTC failed to compile the kernels: {0}")]
    Compile(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

fn drv<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> CudaError + '_ {
    move |e| CudaError::Driver(format!("{what}: {e:?}"))
}

/// Whether a CUDA driver with at least one device and NVRTC can be loaded. Never panics.
pub fn available() -> Result<()> {
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::Unavailable("libcuda (the NVIDIA driver) was not found".into()));
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Unavailable("libnvrtc was not found".into()));
    }
    let n = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| CudaError::Unavailable("the CUDA driver could not be loaded".into()))?
        .map_err(|e| CudaError::Unavailable(format!("no usable CUDA device: {e:?}")))?;
    if n < 1 {
        return Err(CudaError::Unavailable("no CUDA device".into()));
    }
    Ok(())
}

/// NVRTC's version as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut a, mut b) = (0, 0);
    let r = unsafe { nsys::nvrtcVersion(&mut a, &mut b) };
    if r != nsys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile(format!("nvrtcVersion: {r:?}")));
    }
    Ok((a, b))
}

/// One GPU: its context and the stream every kernel runs on.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// Compute capability, e.g. (9, 0).
    pub cc: (i32, i32),
    pub name: String,
}

impl Gpu {
    pub fn new(ordinal: usize) -> Result<Self> {
        available()?;
        let ctx = CudaContext::new(ordinal).map_err(drv("creating the context"))?;
        // Buffers are managed here (raw pointers, one stream); per-slice events would also break graph capture.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("creating a stream"))?;
        let cc = ctx.compute_capability().map_err(drv("compute capability"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        Ok(Gpu { ctx, stream, cc, name })
    }

    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("binding the context"))
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(drv("memory info"))
    }

    /// The NVRTC target: `sm_90a` on Hopper (its own instructions), else `sm_XY`.
    pub fn arch(&self) -> String {
        let (a, b) = self.cc;
        if a == 9 && b == 0 { "sm_90a".into() } else { format!("sm_{a}{b}") }
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevBuf> {
        self.bind()?;
        let ptr = unsafe { dres::malloc_sync(bytes.max(256)) }.map_err(drv("allocating device memory"))?;
        Ok(DevBuf { ptr, bytes, ctx: self.ctx.clone() })
    }

    /// A device copy of `data`.
    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<DevBuf> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        unsafe { dres::memcpy_htod_sync(b.ptr, data) }.map_err(drv("copying to the device"))?;
        Ok(b)
    }

    /// Stream-ordered copy into `dst` at byte offset 0.
    pub fn htod<T: Copy>(&self, dst: &DevBuf, src: &[T]) -> Result<()> {
        debug_assert!(std::mem::size_of_val(src) <= dst.bytes);
        unsafe { dres::memcpy_htod_async(dst.ptr, src, self.stream.cu_stream()) }.map_err(drv("copy to device"))
    }

    /// Stream-ordered copy into `dst` at byte offset `at`.
    pub fn htod_at<T: Copy>(&self, dst: &DevBuf, at: usize, src: &[T]) -> Result<()> {
        debug_assert!(at + std::mem::size_of_val(src) <= dst.bytes);
        unsafe { dres::memcpy_htod_async(dst.ptr + at as u64, src, self.stream.cu_stream()) }
            .map_err(drv("copy to device"))
    }

    /// Stream-ordered copies of host slices to device addresses, in one driver call where the driver has
    /// `cuMemcpyBatchAsync` (CUDA 13: a restored prefix page of a 64-layer model is 128 copies, each costing a few
    /// microseconds of host time on its own), else one call each. The sources must stay as they are until the stream
    /// has copied them when they are page-locked.
    pub fn htod_many<T: Copy>(&self, copies: &[(u64, &[T])]) -> Result<()> {
        use cudarc::driver::sys;
        use std::sync::OnceLock;
        static BATCH: OnceLock<bool> = OnceLock::new();
        let batch = *BATCH.get_or_init(|| {
            let mut v = 0;
            // SAFETY: writes one int.
            let r = unsafe { sys::cuDriverGetVersion(&mut v) };
            r == sys::CUresult::CUDA_SUCCESS && v >= 13000 && std::env::var_os("SPLASH_CUDA_NO_BATCH_COPY").is_none()
        });
        if batch && copies.len() > 1 {
            let mut dsts: Vec<u64> = copies.iter().map(|c| c.0).collect();
            let mut srcs: Vec<u64> = copies.iter().map(|c| c.1.as_ptr() as u64).collect();
            let mut sizes: Vec<usize> = copies.iter().map(|c| std::mem::size_of_val(c.1)).collect();
            // SAFETY: a plain C struct; zero is a valid (unhinted) location and no flags.
            let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
            attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
            let mut idx = [0usize];
            // SAFETY: `count` entries in each array, one attribute for all of them from index 0; the sources and
            // destinations are the caller's live host slices and device addresses.
            let r = unsafe {
                sys::cuMemcpyBatchAsync_v2(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    copies.len(),
                    &mut attr,
                    idx.as_mut_ptr(),
                    1,
                    self.stream.cu_stream(),
                )
            };
            if r == sys::CUresult::CUDA_SUCCESS {
                return Ok(());
            }
        }
        for &(dst, src) in copies {
            unsafe { dres::memcpy_htod_async(dst, src, self.stream.cu_stream()) }.map_err(drv("copy to device"))?;
        }
        Ok(())
    }

    /// Stream-ordered copy of `bytes` bytes from device address `src` to `dst`.
    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        unsafe { dres::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }.map_err(drv("device copy"))
    }

    /// Stream-ordered zeroing of `bytes` bytes at device address `dst`.
    pub fn memset_zero(&self, dst: u64, bytes: usize) -> Result<()> {
        unsafe { dres::memset_d8_async(dst, 0, bytes, self.stream.cu_stream()) }.map_err(drv("zeroing device memory"))
    }

    /// Stream-ordered copy out of `src`; waits for the stream.
    pub fn dtoh<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<()> {
        unsafe { dres::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }.map_err(drv("copy to host"))?;
        self.sync()
    }

    /// Page-locked host memory for `len` values, zeroed (copies to and from it run at full link speed, need no
    /// staging copy and are truly asynchronous).
    pub fn alloc_pinned<T: PinnedValue>(&self, len: usize) -> Result<Pinned<T>> {
        self.bind()?;
        let bytes = len.max(1) * std::mem::size_of::<T>();
        let ptr = unsafe { dres::malloc_host(bytes, 0) }.map_err(drv("allocating pinned host memory"))?;
        // SAFETY: the allocation holds `bytes` bytes; zeroed, which is a valid value of every `PinnedValue`.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(Pinned { ptr: ptr as *mut T, len, ctx: self.ctx.clone() })
    }

    /// Stream-ordered copy of `len` f32 values from `src` into `dst`; waits for the stream.
    pub fn dtoh_pinned(&self, dst: &mut PinnedF32, src: u64, len: usize) -> Result<()> {
        debug_assert!(len <= dst.len);
        self.dtoh(&mut dst.as_mut_slice()[..len], src)
    }

    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv("synchronizing the stream"))
    }

    /// Launches `f` with the given raw kernel arguments (pointers to each argument's value).
    pub fn launch(&self, f: &CudaFunction, grid: (u32, u32, u32), block: u32, args: &mut [*mut c_void]) -> Result<()> {
        unsafe { dres::launch_kernel(f.cu_function(), grid, (block, 1, 1), 0, self.stream.cu_stream(), args) }
            .map_err(drv("launching a kernel"))
    }

    /// Launches `f` like [`Gpu::launch`], with programmatic dependent launch when `pdl` (the kernel may start
    /// while the previous one drains; it must call `griddepcontrol.wait` before reading what that one wrote).
    pub fn launch_pdl(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &mut [*mut c_void],
        pdl: bool,
    ) -> Result<()> {
        if !pdl {
            return self.launch(f, grid, block, args);
        }
        use cudarc::driver::sys as ds;
        let mut attr: ds::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = ds::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = ds::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let r = unsafe { ds::cuLaunchKernelEx(&cfg, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) };
        if r == ds::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CudaError::Driver(format!("launching a kernel (programmatic dependent launch): {r:?}")))
        }
    }

    /// Compiles `src` for this GPU (or loads it from the disk cache) and returns the module and the seconds spent
    /// compiling (0 on a cache hit).
    pub fn compile(&self, src: &str, cache_dir: Option<PathBuf>) -> Result<(Arc<CudaModule>, f64, bool)> {
        let arch = self.arch();
        let (maj, min) = nvrtc_version()?;
        let mut h = Sha256::new();
        h.update(src.as_bytes());
        h.update(arch.as_bytes());
        h.update(format!("nvrtc {maj}.{min}").as_bytes());
        let key: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
        let path = cache_dir.as_ref().map(|d| d.join(format!("{key}-{arch}.cubin")));
        if let Some(p) = &path
            && let Ok(bin) = std::fs::read(p)
        {
            self.bind()?;
            if let Ok(m) = self.ctx.load_module(Ptx::from_binary(bin)) {
                return Ok((m, 0.0, true));
            }
        }
        let t0 = Instant::now();
        let bin = nvrtc_cubin(src, &arch)?;
        let secs = t0.elapsed().as_secs_f64();
        if let (Some(d), Some(p)) = (&cache_dir, &path) {
            let _ = std::fs::create_dir_all(d);
            let tmp = p.with_extension("partial");
            if std::fs::write(&tmp, &bin).is_ok() {
                let _ = std::fs::rename(&tmp, p);
            }
        }
        self.bind()?;
        let m = self.ctx.load_module(Ptx::from_binary(bin)).map_err(drv("loading the compiled kernels"))?;
        Ok((m, secs, false))
    }
}

/// Compiles CUDA C++ to a CUBIN for `arch` with NVRTC.
pub fn nvrtc_cubin(src: &str, arch: &str) -> Result<Vec<u8>> {
    let csrc = CString::new(src).map_err(|_| CudaError::Compile("source holds a NUL byte".into()))?;
    let prog = cudarc::nvrtc::result::create_program(&csrc, Some(c"splash.cu"))
        .map_err(|e| CudaError::Compile(format!("{e:?}")))?;
    let mut opts = vec![format!("--gpu-architecture={arch}"), "-default-device".into(), "--std=c++17".into()];
    // Development: each kernel's registers, spills and shared memory from ptxas, printed to stderr.
    let verbose = std::env::var("SPLASH_NVRTC_VERBOSE").is_ok_and(|v| v == "1");
    if verbose {
        opts.push("--ptxas-options=-v".into());
    }
    let res = unsafe { cudarc::nvrtc::result::compile_program(prog, &opts) };
    // SAFETY: `prog` is a live program, compiled (successfully or not) above.
    let log = || {
        let log = unsafe { cudarc::nvrtc::result::get_program_log(prog) }.unwrap_or_default();
        let log: Vec<u8> = log.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
        String::from_utf8_lossy(&log).into_owned()
    };
    if verbose && res.is_ok() {
        eprintln!("{}", log());
    }
    if res.is_err() {
        let log = log();
        unsafe {
            let _ = cudarc::nvrtc::result::destroy_program(prog);
        }
        return Err(CudaError::Compile(log));
    }
    let mut size = 0usize;
    let bin = unsafe {
        let r = nsys::nvrtcGetCUBINSize(prog, &mut size);
        if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            let _ = cudarc::nvrtc::result::destroy_program(prog);
            return Err(CudaError::Compile(format!("nvrtcGetCUBINSize: {r:?}")));
        }
        let mut bin = vec![0u8; size];
        let r = nsys::nvrtcGetCUBIN(prog, bin.as_mut_ptr() as *mut _);
        let _ = cudarc::nvrtc::result::destroy_program(prog);
        if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            return Err(CudaError::Compile(format!("nvrtcGetCUBIN: {r:?}")));
        }
        bin
    };
    Ok(bin)
}

/// cuBLAS, loaded at run time like every CUDA library: the tensor-core matrix products of long prefill chunks.
/// [`Blas::new`] answers an error (never panics) when libcublas is missing.
pub struct Blas {
    handle: cudarc::cublas::sys::cublasHandle_t,
    ctx: Arc<CudaContext>,
}

/// Element types of [`Blas`] operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlasType {
    F16,
    F32,
}

/// One operand: device address, element type and leading dimension (column-major, as cuBLAS sees it).
#[derive(Debug, Clone, Copy)]
pub struct BlasMat {
    pub ptr: u64,
    pub ty: BlasType,
    pub ld: usize,
    /// Elements between consecutive matrices of a strided batch.
    pub stride: usize,
}

impl BlasMat {
    pub fn new(ptr: u64, ty: BlasType, ld: usize) -> Self {
        BlasMat { ptr, ty, ld, stride: 0 }
    }
    pub fn strided(self, stride: usize) -> Self {
        BlasMat { stride, ..self }
    }
}

fn blas_ty(t: BlasType) -> cudarc::cublas::sys::cudaDataType {
    use cudarc::cublas::sys::cudaDataType::*;
    match t {
        BlasType::F16 => CUDA_R_16F,
        BlasType::F32 => CUDA_R_32F,
    }
}

fn blas_ok(what: &str, s: cudarc::cublas::sys::cublasStatus_t) -> Result<()> {
    if s == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver(format!("{what}: {s:?}")))
    }
}

impl Blas {
    /// A cuBLAS handle on `gpu`'s stream.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        use cudarc::cublas::sys as cs;
        if !unsafe { cs::is_culib_present() } {
            return Err(CudaError::Unavailable("libcublas was not found".into()));
        }
        gpu.bind()?;
        let (r, handle) = std::panic::catch_unwind(|| {
            let mut handle: cs::cublasHandle_t = std::ptr::null_mut();
            let r = unsafe { cs::cublasCreate_v2(&mut handle) };
            (r, handle as usize)
        })
        .map_err(|_| CudaError::Unavailable("libcublas could not be loaded".into()))?;
        blas_ok("cublasCreate", r)?;
        let handle = handle as cs::cublasHandle_t;
        let blas = Blas { handle, ctx: gpu.ctx.clone() };
        blas_ok("cublasSetStream", unsafe {
            cs::cublasSetStream_v2(handle, gpu.stream.cu_stream() as cs::cudaStream_t)
        })?;
        Ok(blas)
    }

    /// C[m, n] = alpha op(A) op(B) + beta C in cuBLAS's column-major terms, f32 accumulation on tensor cores; with
    /// `batch` > 1 the operands advance by their strides.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        trans_a: bool,
        trans_b: bool,
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        a: BlasMat,
        b: BlasMat,
        beta: f32,
        c: BlasMat,
        batch: usize,
    ) -> Result<()> {
        use cudarc::cublas::sys as cs;
        let op = |t: bool| if t { cs::cublasOperation_t::CUBLAS_OP_T } else { cs::cublasOperation_t::CUBLAS_OP_N };
        let dim = |v: usize| -> Result<i32> {
            i32::try_from(v).map_err(|_| CudaError::Other(format!("matrix dimension {v} is too large for cuBLAS")))
        };
        let (alpha, beta) = (&alpha as *const f32 as *const c_void, &beta as *const f32 as *const c_void);
        let compute = cs::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = cs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        let r = unsafe {
            if batch <= 1 {
                cs::cublasGemmEx(
                    self.handle,
                    op(trans_a),
                    op(trans_b),
                    dim(m)?,
                    dim(n)?,
                    dim(k)?,
                    alpha,
                    a.ptr as *const c_void,
                    blas_ty(a.ty),
                    dim(a.ld)?,
                    b.ptr as *const c_void,
                    blas_ty(b.ty),
                    dim(b.ld)?,
                    beta,
                    c.ptr as *mut c_void,
                    blas_ty(c.ty),
                    dim(c.ld)?,
                    compute,
                    algo,
                )
            } else {
                cs::cublasGemmStridedBatchedEx(
                    self.handle,
                    op(trans_a),
                    op(trans_b),
                    dim(m)?,
                    dim(n)?,
                    dim(k)?,
                    alpha,
                    a.ptr as *const c_void,
                    blas_ty(a.ty),
                    dim(a.ld)?,
                    a.stride as i64,
                    b.ptr as *const c_void,
                    blas_ty(b.ty),
                    dim(b.ld)?,
                    b.stride as i64,
                    beta,
                    c.ptr as *mut c_void,
                    blas_ty(c.ty),
                    dim(c.ld)?,
                    c.stride as i64,
                    dim(batch)?,
                    compute,
                    algo,
                )
            }
        };
        blas_ok("cublasGemmEx", r)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            unsafe {
                let _ = cudarc::cublas::sys::cublasDestroy_v2(self.handle);
            }
        }
    }
}

// SAFETY: the handle is used from one thread at a time (the runner's), with its context bound.
unsafe impl Send for Blas {}

/// Plain numbers for which all-zero bytes are a valid value (what [`Gpu::alloc_pinned`] hands out).
pub trait PinnedValue: Copy {}
impl PinnedValue for f32 {}
impl PinnedValue for u32 {}
impl PinnedValue for u16 {}

/// Page-locked host memory holding `T` values, freed on drop.
pub struct Pinned<T: PinnedValue> {
    ptr: *mut T,
    len: usize,
    ctx: Arc<CudaContext>,
}

pub type PinnedF32 = Pinned<f32>;

impl<T: PinnedValue> Pinned<T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The address, which kernels may use too (page-locked memory is mapped into the device's address space).
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    /// Value `i`, read as it is now: the device may write this memory while the host holds it (the caller has
    /// waited for the write it wants).
    pub fn read_volatile(&self, i: usize) -> T {
        assert!(i < self.len, "index {i} out of {}", self.len);
        // SAFETY: in bounds (checked above) of an allocation of len values, zeroed at allocation.
        unsafe { std::ptr::read_volatile(self.ptr.add(i)) }
    }
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: ptr holds len values, zeroed at allocation.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as above; &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: PinnedValue> Drop for Pinned<T> {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            unsafe {
                let _ = dres::free_host(self.ptr as *mut c_void);
            }
        }
    }
}

// SAFETY: plain host memory owned by this value.
unsafe impl<T: PinnedValue> Send for Pinned<T> {}

/// A device allocation, freed on drop.
pub struct DevBuf {
    pub ptr: u64,
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    /// Device address `off` bytes in.
    pub fn at(&self, off: usize) -> u64 {
        self.ptr + off as u64
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            unsafe {
                let _ = dres::free_sync(self.ptr);
            }
        }
    }
}

// SAFETY: a device address is plain data; the context is thread-safe.
unsafe impl Send for DevBuf {}
unsafe impl Sync for DevBuf {}

#[cfg(test)]
mod tests {
    /// Without a driver (CPU-only CI) the probe answers with an error; with one it may succeed. It never panics.
    #[test]
    fn probing_never_panics() {
        match super::available() {
            Ok(()) => eprintln!("a CUDA device is present"),
            Err(e) => eprintln!("no CUDA: {e}"),
        }
        if super::available().is_err() {
            assert!(super::Gpu::new(0).is_err());
        }
    }
}
