//! Pieces of stablehlo while loops: the condition of a series loop (`loop_more`, `any_true`),
//! its counter (`next_count`), and `select_all`, which updates a loop's state on a condition.
use stablehlo::{Builder, CmpDir, ElemType, Value};

/// True where any element of a pred is true, as a 0-d pred (inside loop regions).
pub(crate) fn any_true(b: &mut Builder, p: Value) -> Value {
    let r = b.rank(p) as i64;
    if r == 0 {
        return p;
    }
    let init = b.constant_bool(false);
    let dims: Vec<i64> = (0..r).collect();
    b.reduce(&[p], &[init], &dims, |b, a| vec![b.or(a[0], a[1])])[0]
}

/// A series loop's condition: fewer than `limit` steps taken (the 0-d counter `i`) and some
/// element still `pending`.
pub(crate) fn loop_more(b: &mut Builder, i: Value, pending: Value, limit: i64) -> Value {
    let lim = b.constant_i64(limit, ElemType::I64);
    let more = b.compare(CmpDir::Lt, i, lim);
    let any = any_true(b, pending);
    b.and(more, any)
}

/// A loop counter's next value, i + 1.
pub(crate) fn next_count(b: &mut Builder, i: Value) -> Value {
    let one_i = b.constant_i64(1, ElemType::I64);
    b.add(i, one_i)
}

/// select(pred, on_true[k], on_false[k]) for each k: one condition choosing between two sets
/// of values (the cases of dlanv2 and dlahqr's steps, the state updates of series loops).
pub(crate) fn select_all(b: &mut Builder, pred: Value, on_true: &[Value], on_false: &[Value]) -> Vec<Value> {
    on_true.iter().zip(on_false).map(|(&t, &f)| b.select(pred, t, f)).collect()
}
