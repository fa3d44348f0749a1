//! The bound on a parameter's size that lets every layout kind compute with plain arithmetic:
//! each kind says whether its whole tensor, and every size it derives from it, stays within it
//! ([`super::Kind::fits`]), and the planner refuses the parameter before using a geometry that
//! does not.

/// The most elements one parameter may have: 2^56, millions of times the largest real tensor
/// (a 512-expert fused weight has about 2^35), and far enough below 2^64 that every size the
/// layouts derive from it (bytes at 8 a value, padding, kv-head replication) stays in range.
const MAX_NUMEL: u64 = 1 << 56;

/// The product of `dims`, if it and each of them is within [`MAX_NUMEL`].
pub(super) fn product(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |a, &d| {
        a.checked_mul(d)
            .filter(|&n| n <= MAX_NUMEL && d <= MAX_NUMEL)
    })
}

/// The sum of `dims`, if it does not overflow.
pub(super) fn sum(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(0u64, |a, &d| a.checked_add(d))
}

/// Ok when the tensor's element count `numel` was computed within range; else the dimensions
/// `values`, for the message.
pub(super) fn within(numel: Option<u64>, values: Vec<u64>) -> Result<(), Vec<u64>> {
    match numel {
        Some(_) => Ok(()),
        None => Err(values),
    }
}

/// A shape's tensor within range.
pub(super) fn shape(dims: &[u64]) -> Result<(), Vec<u64>> {
    within(product(dims), dims.to_vec())
}

/// `[rows, inner...]` within range, where `rows` (if it could be computed) stands for `values`'
/// leading dimensions.
pub(super) fn rows_of(rows: Option<u64>, inner: &[u64], values: Vec<u64>) -> Result<(), Vec<u64>> {
    within(rows.and_then(|r| product(&[&[r], inner].concat())), values)
}

/// A fused expert weight `[experts, 2 · intermediate, hidden]` within range.
pub(super) fn experts(experts: u64, intermediate: u64, hidden: u64) -> Result<(), Vec<u64>> {
    within(
        product(&[experts, 2, intermediate, hidden]),
        vec![experts, intermediate, hidden],
    )
}
