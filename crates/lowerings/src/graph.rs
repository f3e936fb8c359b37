//! Whole graphs (torch.compile): an FX graph of aten ops, lowered node by node with the same
//! lowerings eager mode uses, into one program. A graph is registered once and run through
//! the op `torchtpu::run_graph(int graph, Tensor[] inputs) -> Tensor[]`, so the engine keys,
//! caches and runs it like any other op (one executable per graph and input layout). Also the
//! prims PyTorch's decompositions leave in graphs (prims::convert_element_type).
//!
//! Inputs the graph mutates (optimizer state, buffers, KV caches: AOTAutograd keeps them as
//! trailing `copy_(input, new_value)` nodes) run through
//! `torchtpu::run_graph_(int graph, Tensor(a!)[] mutated, Tensor[] inputs) -> Tensor[]`:
//! the engine writes the new values into the mutated inputs' storages and donates their old
//! buffers to the program, so an update in place needs no second copy of the state.
use crate::args::{Arg, Args, FloatArg, Tensor};
use crate::cx::Cx;
use crate::dtype::{DType, Rank};
use crate::error::Result;
use crate::{bail, check, Out, op, Op};
use std::sync::{Arc, Mutex};

/// A node argument: a reference to an earlier value, or a constant.
#[derive(Clone, Debug)]
pub enum GArg {
    /// Value `i` (inputs first, then node results in order).
    Ref(usize),
    /// Item `j` of value `i` (a node that returns several tensors).
    Item(usize, usize),
    None,
    Int(i64),
    Float(f64),
    Bool(bool),
    IntList(Vec<i64>),
    FloatList(Vec<f64>),
    BoolList(Vec<bool>),
    Str(String),
    DType(DType),
    List(Vec<GArg>),
}

#[derive(Clone, Debug)]
pub struct Node {
    /// The aten op's qualified name, e.g. `aten::add`.
    pub target: String,
    pub arg_names: Vec<String>,
    pub args: Vec<GArg>,
}

#[derive(Clone, Debug)]
pub struct Graph {
    pub num_inputs: usize,
    pub nodes: Vec<Node>,
    pub outputs: Vec<GArg>,
    /// The inputs written by `copy_` nodes, in the order of run_graph_'s `mutated` list.
    pub mutated: Vec<usize>,
}

static GRAPHS: Mutex<Vec<Arc<Graph>>> = Mutex::new(Vec::new());

/// Registers a graph; the id is the first argument of `run_graph`.
pub fn register_graph(g: Graph) -> i64 {
    let mut gs = GRAPHS.lock().unwrap();
    gs.push(Arc::new(g));
    (gs.len() - 1) as i64
}

fn graph(id: i64) -> Result<Arc<Graph>> {
    let gs = GRAPHS.lock().unwrap();
    match gs.get(id as usize) {
        Some(g) => Ok(g.clone()),
        None => bail!(Runtime, "torchtpu: unknown graph id {}", id),
    }
}

pub(crate) const OPS: &[Op] = &[
    // Also run_graph_ (the same base name), which writes the mutated inputs.
    op("torchtpu::run_graph", run_graph).host_tensors(),
    // Prims that PyTorch's decompositions leave in graphs (with symbolic sizes in particular).
    op("prims::convert_element_type", convert_element_type),
];

/// prims.convert_element_type(a, dtype): a cast with no type promotion of its own.
fn convert_element_type(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("a")?;
    let dtype = args.dtype("dtype")?.unwrap_or(a.dtype);
    crate::one(cx.cast(a.v, dtype))
}

/// Lowers every node of the graph on the tensor inputs and returns the graph's outputs; for
/// run_graph_, first the new values of the mutated inputs.
fn run_graph(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = graph(args.int("graph")?)?;
    let inputs = args.tensors("inputs")?;
    check!(inputs.len() == g.num_inputs, Runtime, "graph takes {} inputs, got {}", g.num_inputs, inputs.len());
    let writes = args.names.iter().any(|n| n == "mutated");
    if writes {
        let mutated = args.tensors("mutated")?;
        check!(mutated.len() == g.mutated.len(), Runtime, "graph mutates {} inputs, got {}", g.mutated.len(), mutated.len());
    } else {
        check!(g.mutated.is_empty(), Runtime, "torchtpu.compile: a graph that mutates its inputs runs as run_graph_");
    }
    let mut values: Vec<Out> = inputs.iter().map(|t| Out::Tensor(t.v)).collect();
    // The newest value written into each input by a copy_ node.
    let mut written: Vec<Option<stablehlo::Value>> = vec![None; g.num_inputs];
    for node in &g.nodes {
        let base = crate::base_name(&node.target);
        let lowering = match crate::registry().get(base) {
            Some(l) => *l,
            None => bail!(NotImplemented, "torchtpu.compile: no lowering for {} in a compiled graph", node.target),
        };
        let vals: Vec<Arg> = node.args.iter().map(|a| arg(cx, &values, a)).collect::<Result<_>>()?;
        // What a lowering cannot do in a graph is said as the compiler's refusal, so that the
        // backend runs the graph eagerly instead (dynamo.py).
        let outs = (lowering.f)(cx, &Args { op: base, names: &node.arg_names, values: &vals }).map_err(|e| match e.kind {
            crate::error::ErrorKind::NotImplemented if !e.message.starts_with("torchtpu.compile:") => {
                crate::error::TorchError { kind: e.kind, message: format!("torchtpu.compile: {}: {}", node.target, e.message) }
            }
            _ => e,
        })?;
        if node.target == "aten::copy_" {
            if let (Some(GArg::Ref(i)), Some(Out::Tensor(v))) = (node.args.first(), outs.first()) {
                if *i < g.num_inputs {
                    written[*i] = Some(*v);
                }
            }
        }
        values.push(match outs.len() {
            1 => outs.into_iter().next().unwrap(),
            // Several results (e.g. native_layer_norm): one list value, read with Item.
            _ => Out::List(
                outs.into_iter()
                    .map(|o| match o {
                        Out::Tensor(v) => Ok(v),
                        // Graphs never read an undefined result: stand in an empty tensor.
                        Out::Undefined => Ok(cx.full(0.0, crate::DType::F32, &[0])),
                        Out::List(_) => bail!(NotImplemented, "torchtpu.compile: nested results of {}", node.target),
                    })
                    .collect::<Result<_>>()?,
            ),
        });
    }
    let mut outs = Vec::with_capacity(g.outputs.len());
    for o in &g.outputs {
        match arg(cx, &values, o)? {
            Arg::Tensor(t) => outs.push(t.v),
            other => bail!(Runtime, "torchtpu.compile: graph output {:?} is not a tensor", other),
        }
    }
    if !writes {
        return Ok(vec![Out::List(outs)]);
    }
    let mut news = Vec::with_capacity(g.mutated.len());
    for &i in &g.mutated {
        match written.get(i) {
            Some(Some(v)) => news.push(*v),
            _ => bail!(Runtime, "torchtpu.compile: graph input {} is listed as mutated but no copy_ writes it", i),
        }
    }
    Ok(vec![Out::List(news), Out::List(outs)])
}

fn tensor(cx: &Cx, v: stablehlo::Value) -> Arg {
    let dtype = cx.dtype(v);
    let rank = if cx.dims(v).is_empty() { Rank::ZeroDim } else { Rank::Dim };
    Arg::Tensor(Tensor { v, dtype, rank })
}

fn arg(cx: &Cx, values: &[Out], a: &GArg) -> Result<Arg> {
    Ok(match a {
        GArg::Ref(i) => match values.get(*i) {
            Some(Out::Tensor(v)) => tensor(cx, *v),
            Some(Out::List(vs)) => Arg::List(vs.iter().map(|&v| tensor(cx, v)).collect()),
            Some(Out::Undefined) => Arg::None,
            None => bail!(Runtime, "torchtpu.compile: reference to value {} before it exists", i),
        },
        GArg::Item(i, j) => match values.get(*i) {
            Some(Out::List(vs)) if *j < vs.len() => tensor(cx, vs[*j]),
            Some(Out::Tensor(v)) if *j == 0 => tensor(cx, *v),
            _ => bail!(Runtime, "torchtpu.compile: no item {} of value {}", j, i),
        },
        GArg::None => Arg::None,
        GArg::Int(i) => Arg::Int(*i),
        // Constants of a graph are compiled in: dynamo guards on them.
        GArg::Float(f) => Arg::Float(FloatArg { value: *f, slot: None }),
        GArg::Bool(b) => Arg::Bool(*b),
        GArg::IntList(v) => Arg::IntList(v.clone()),
        GArg::FloatList(v) => Arg::FloatList(v.clone()),
        GArg::BoolList(v) => Arg::BoolList(v.clone()),
        GArg::Str(s) => Arg::Str(s.clone()),
        GArg::DType(d) => Arg::DType(*d),
        GArg::List(items) => Arg::List(items.iter().map(|x| arg(cx, values, x)).collect::<Result<_>>()?),
    })
}
