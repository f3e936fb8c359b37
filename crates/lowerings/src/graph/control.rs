//! Control flow in compiled graphs: `torch.cond` as stablehlo.case and `while_loop` as
//! stablehlo.while, their subgraphs lowered inside the regions with the same lowerings.
//!
//! Data-dependent checks made inside a region (an index read in a branch) cannot leave it as
//! they are: each region folds its checks into one int64 [3] result (the first failing check,
//! numbered across all of the node's checks), which becomes one check of the program. Only the
//! branch that runs can fail, as in eager mode; a loop stops at its first failing iteration.
use super::{arg, lower, Draws, GArg, Graph, Node};
use crate::args::Arg;
use crate::cx::{CheckEval, Cx};
use crate::error::{ErrorKind, Result};
use crate::{bail, check, Out};
use stablehlo::{CmpDir, ElemType, TensorType, Value};
use std::sync::Arc;

/// cond(pred, true_graph, false_graph, operands) -> the taken branch's outputs.
pub(super) fn cond(cx: &mut Cx, values: &[Out], node: &Node, draws: &mut Draws) -> Result<Out> {
    let [pred, GArg::Graph(on_true), GArg::Graph(on_false), operands] = &node.args[..] else {
        bail!(Runtime, "torchtpu.compile: malformed cond node")
    };
    let operands = tensors(cx, values, operands, draws)?;
    let pred = match arg(cx, values, pred, draws)? {
        Arg::Tensor(t) => {
            check!(cx.dims(t.v).is_empty(), Runtime, "torchtpu.compile: cond's predicate must be a 0-d tensor");
            cx.cast(t.v, crate::DType::Bool)
        }
        // A predicate fixed at trace time: only its branch exists.
        Arg::Bool(b) => return lower_inline(cx, if b { on_true } else { on_false }, operands, draws),
        other => bail!(Runtime, "torchtpu.compile: cond's predicate {:?}", other),
    };
    // stablehlo.case runs branch 0 for index 0 and the last branch otherwise.
    let zero = cx.constant_i64(0, ElemType::I32);
    let one = cx.constant_i64(1, ElemType::I32);
    let index = cx.select(pred, zero, one);
    let mut folded = Folded::default();
    let (mut texts, mut types) = (Vec::new(), Vec::new());
    for branch in [on_true, on_false] {
        cx.open_region(&[]);
        let start = cx.checks.len();
        let mut outs = lower(cx, branch, operands.iter().map(|&v| Out::Tensor(v)).collect(), draws, &mut [])?;
        outs.push(folded.fold(cx, start)?);
        let (text, got) = cx.close_region(&outs);
        check!(
            types.is_empty() || types == got,
            Runtime,
            "torchtpu.compile: cond's branches return different types: {:?} and {:?}",
            types,
            got
        );
        texts.push(text);
        types = got;
    }
    let mut results = cx.case(index, &texts, &types);
    let bad = results.pop().unwrap();
    folded.add_to(cx, bad);
    Ok(Out::List(results))
}

/// while_loop(cond_graph, body_graph, carried, additional) -> the carried values at the end.
///
/// In a graph that draws random numbers the loop also carries a generator state of its own:
/// the body's random ops draw from it (node k of the body from its counter + k * 2^40, as a
/// graph's nodes do), and each iteration moves it past the body's streams, so every iteration
/// draws new numbers. Its key is the call's key moved by the loop's place among the graph's
/// streams, so the loop's streams never meet the graph's own.
pub(super) fn while_loop(cx: &mut Cx, values: &[Out], node: &Node, draws: &mut Draws) -> Result<Out> {
    let [GArg::Graph(cond_graph), GArg::Graph(body_graph), carried, additional] = &node.args[..] else {
        bail!(Runtime, "torchtpu.compile: malformed while_loop node")
    };
    let carried = tensors(cx, values, carried, draws)?;
    let additional = tensors(cx, values, additional, draws)?;
    let n = carried.len();
    // The loop values: the carried ones, the loop's generator state (where the graph draws)
    // and the folded check (zero until an iteration fails).
    let mut inits = carried.clone();
    let random = draws.state.is_some();
    if random {
        let place = draws.next;
        let stream = draws.stream(cx)?;
        let rekey = cx.constant_array_i64(&[LOOP_KEY_STEP.wrapping_mul(place + 1) & i64::MAX, 0], &[2], ElemType::U64);
        inits.push(cx.add(stream, rekey));
    }
    let check_at = inits.len();
    inits.push(no_failure(cx));
    let types: Vec<TensorType> = inits.iter().map(|&v| cx.ty(v).clone()).collect();

    let args = cx.open_region(&types);
    let start = cx.checks.len();
    let inputs = args[..n].iter().chain(&additional).map(|&v| Out::Tensor(v)).collect();
    let draws_before = draws.next;
    let more = lower(cx, cond_graph, inputs, draws, &mut [])?;
    check!(draws.next == draws_before, NotImplemented, "torchtpu.compile: random ops inside a while_loop condition");
    check!(cx.checks.len() == start, NotImplemented, "torchtpu.compile: a while_loop condition with a data-dependent check");
    let [more] = more[..] else { bail!(Runtime, "torchtpu.compile: while_loop's condition must return one tensor") };
    check!(cx.dims(more).is_empty(), Runtime, "torchtpu.compile: while_loop's condition must return a 0-d tensor");
    let more = cx.cast(more, crate::DType::Bool);
    let ok = passed(cx, args[check_at]);
    let go = cx.and(more, ok);
    let (cond_text, _) = cx.close_region(&[go]);

    let args = cx.open_region(&types);
    let inputs = args[..n].iter().chain(&additional).map(|&v| Out::Tensor(v)).collect();
    let mut body_draws = Draws { state: random.then(|| args[n]), next: 0 };
    let mut next = lower(cx, body_graph, inputs, &mut body_draws, &mut [])?;
    if random {
        let step = cx.constant_array_i64(&[0, body_draws.next << 40], &[2], ElemType::U64);
        next.push(cx.add(args[n], step));
    }
    let mut folded = Folded::default();
    let bad = folded.fold(cx, start)?;
    let ok = passed(cx, args[check_at]);
    next.push(cx.select(ok, bad, args[check_at]));
    for (k, v) in next.iter_mut().enumerate().take(n) {
        let want = types[k].elem;
        if cx.ty(*v).elem != want {
            *v = cx.convert(*v, want);
        }
    }
    let (body_text, got) = cx.close_region(&next);
    check!(got == types, Runtime, "torchtpu.compile: while_loop's body returns {:?} for carried values {:?}", got, types);

    let mut results = cx.while_regions(&inits, cond_text, body_text);
    let bad = results.pop().unwrap();
    results.truncate(n);
    folded.add_to(cx, bad);
    Ok(Out::List(results))
}

/// What a while_loop's generator key is moved by, per place among its graph's streams (an odd
/// constant, so that distinct places give distinct keys).
const LOOP_KEY_STEP: i64 = 0x1E37_79B9_7F4A_7C15;

/// A branch fixed at trace time, lowered in place.
fn lower_inline(cx: &mut Cx, g: &Arc<Graph>, operands: Vec<Value>, draws: &mut Draws) -> Result<Out> {
    let outs = lower(cx, g, operands.into_iter().map(Out::Tensor).collect(), draws, &mut [])?;
    Ok(Out::List(outs))
}

pub(super) fn tensors(cx: &mut Cx, values: &[Out], a: &GArg, draws: &mut Draws) -> Result<Vec<Value>> {
    match arg(cx, values, a, draws)? {
        Arg::List(items) => items
            .into_iter()
            .map(|x| match x {
                Arg::Tensor(t) => Ok(t.v),
                other => bail!(NotImplemented, "torchtpu.compile: a control-flow operand {:?} that is not a tensor", other),
            })
            .collect(),
        Arg::IntList(v) if v.is_empty() => Ok(Vec::new()),  // () reads as an empty int list
        other => bail!(Runtime, "torchtpu.compile: control-flow operands {:?}", other),
    }
}

/// [0, 0, 0]: no check failed.
pub(super) fn no_failure(cx: &mut Cx) -> Value {
    cx.constant_array_i64(&[0, 0, 0], &[3], ElemType::I64)
}

/// Whether a folded check value says nothing failed.
pub(super) fn passed(cx: &mut Cx, bad: Value) -> Value {
    let code = cx.slice(bad, &[0], &[1], &[1]);
    let code = cx.reshape(code, &[]);
    let zero = cx.constant_i64(0, ElemType::I64);
    cx.compare(CmpDir::Eq, code, zero)
}

/// The checks of a node's regions, folded into one: the kind they share and every member's
/// message, numbered in the order the regions were lowered.
#[derive(Default)]
pub(super) struct Folded {
    kind: Option<ErrorKind>,
    messages: Vec<String>,
}

impl Folded {
    /// Takes the checks the region added since `start` out of `cx` and returns their fold (the
    /// first failing one, its member renumbered), to be returned from the region.
    pub(super) fn fold(&mut self, cx: &mut Cx, start: usize) -> Result<Value> {
        let made: Vec<_> = cx.checks.drain(start..).collect();
        let mut bads = Vec::new();
        for c in made {
            let CheckEval::Device(bad) = c.eval else {
                bail!(NotImplemented, "torchtpu.compile: a check of host index tensors inside a control-flow region")
            };
            check!(
                self.kind.is_none_or(|k| k == c.kind),
                NotImplemented,
                "torchtpu.compile: checks raising different errors inside one control-flow node"
            );
            self.kind = Some(c.kind);
            bads.push((bad, self.messages.len() as i64));
            self.messages.extend(c.messages);
        }
        // The first failing check wins: fold from the last one back.
        let mut acc = no_failure(cx);
        for (bad, offset) in bads.into_iter().rev() {
            let ok = passed(cx, bad);
            let shift = cx.constant_array_i64(&[offset, 0, 0], &[3], ElemType::I64);
            let renumbered = cx.add(bad, shift);
            acc = cx.select(ok, acc, renumbered);
        }
        Ok(acc)
    }

    /// Makes the node's folded result one check of the program.
    pub(super) fn add_to(self, cx: &mut Cx, bad: Value) {
        if let Some(kind) = self.kind {
            cx.add_check(bad, kind, self.messages);
        }
    }
}
