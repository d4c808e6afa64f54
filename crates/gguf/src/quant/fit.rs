//! The scale searches of ggml's K-quant reference quantizers (`make_qx_quants`, `make_q3_quants`,
//! `make_qkx2_quants`), transcribed with the same operation order so that results match ggml bit for bit.
//!
//! Each takes a sub-block `x` and writes its integer levels into `levels` (same length); each returns the scale
//! (and `make_qkx2_quants` the subtracted minimum). They assume finite input; other input gives unspecified
//! levels but never panics.

/// Sub-blocks whose largest magnitude is below this are treated as all zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round to nearest, ties to even, by adding 1.5·2²³ and reading the mantissa. Exact for
/// |x| < 2²²; larger or non-finite `x` give a meaningless value (as in ggml with assertions off).
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Largest magnitude and the signed element that has it (the first of equals).
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// Symmetric levels in `-nmax..nmax` (stored `+ nmax`), weighted by `x²`, trying 18 scales around `nmax/max`
/// (ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights; used by Q6_K).
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let (l, w) = (level(iscale, v) as f32, v * v);
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let set_levels = |levels: &mut [i8], iscale: f32| {
        for (q, &v) in levels.iter_mut().zip(x) {
            *q = (level(iscale, v) + nmax) as i8;
        }
    };
    let iscale = -(nmax as f32) / max;
    set_levels(levels, iscale);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            set_levels(levels, iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric levels in `-nmax..nmax` (stored `+ nmax`), weighted by `x²`, refined one level at a time for up to
/// five passes (ggml's `make_q3_quants` with `do_rmse`; used by Q3_K).
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (q, &v) in levels.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *q = l as i8;
        let (l, w) = (l as f32, v * v);
        sumlx += w * v * l;
        suml2 += w * l * l;
    }
    for _ in 0..5 {
        let mut num_changed = 0;
        for (q, &v) in levels.iter_mut().zip(x) {
            let (w, old) = (v * v, *q as f32);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *q as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *q = new_l as i8;
                        (sumlx, suml2) = (slx, sl2);
                        num_changed += 1;
                    }
                }
            }
        }
        if num_changed == 0 {
            break;
        }
    }
    for q in levels.iter_mut() {
        *q += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Search parameters of [`make_qkx2_quants`]: candidate inverse scales are `(rmin + rdelta·i + nmax)/(max − min)`
/// for `i` in `0..=nstep`; the error is weighted absolute (`use_mad`) or squared.
pub(super) struct Qkx2Search {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

/// Asymmetric levels `0..=nmax` with `x ≈ scale·l − min`, fitted by weighted least squares over a range of
/// candidate scales (ggml's `make_qkx2_quants`; used by Q2_K, Q4_K, Q5_K). Returns `(scale, min)`; `min ≥ 0`.
/// `scratch` must be as long as `x`.
pub(super) fn make_qkx2_quants(
    p: &Qkx2Search,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    scratch: &mut [u8],
) -> (f32, f32) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        min = if v < min { v } else { min };
        max = if v > max { v } else { max };
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax as f32;
    let quantize = |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, p.nmax) as u8;
    let error = |levels: &[u8], scale: f32, min: f32| {
        let mut err = 0f32;
        for ((&l, &v), &w) in levels.iter().zip(x).zip(weights) {
            let diff = scale * l as f32 + min - v;
            err += w * if p.use_mad { diff.abs() } else { diff * diff };
        }
        err
    };
    let iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    for (q, &v) in levels.iter_mut().zip(x) {
        *q = quantize(iscale, min, v);
    }
    let mut best_error = error(levels, scale, min);
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for ((q, &v), &w) in scratch.iter_mut().zip(x).zip(weights) {
            *q = quantize(iscale, min, v);
            let l = *q as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let cur_error = error(scratch, this_scale, this_min);
            if cur_error < best_error {
                levels.copy_from_slice(scratch);
                best_error = cur_error;
                (scale, min) = (this_scale, this_min);
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
    }
}
