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
//!
//! A graph that draws random numbers (dropout, rand, bernoulli, ...) runs as the overloads
//! `run_graph.random` / `run_graph_.random`, whose trailing `Generator? generator` the shim
//! fills from the device's default generator: one (seed, offset) per call, advanced like an
//! eager random op's, so reruns under the same seed reproduce. Each drawing node gets its own
//! stream of that call's key (see `Draws`). Activation checkpointing recomputes random ops in
//! the backward graph with the forward's draws: the forward saves a node's stream as a tensor
//! (the pseudo-node `torchtpu::rng_stream`, which yields the call's next stream) and the
//! backward draws from that tensor (`GArg::Generator(Some(value))`).
use crate::args::{Arg, Args, FloatArg, Tensor};
use crate::cx::Cx;
use crate::dtype::{DType, Rank};
use crate::error::Result;
use crate::{bail, check, Out, op, Op};
use std::sync::{Arc, Mutex};

mod control;
mod flex_attention;

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
    /// The device generator (a random op's `generator=None`, or the hidden one of an op tagged
    /// nondeterministic_seeded): the next stream of the call's generator state (None), or the
    /// stream held by value `i`, a u64[2] tensor (`torchtpu::rng_stream`'s, or a saved one).
    Generator(Option<usize>),
    /// A subgraph (a branch of cond, a while_loop's condition or body, flex attention's score
    /// and mask functions): its inputs are the operands the node passes it.
    Graph(Arc<Graph>),
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
    // Also run_graph_ (the same base name), which writes the mutated inputs. Its nodes check
    // their float4 tensors themselves.
    op("torchtpu::run_graph", run_graph).host_tensors().float4(),
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
    let inputs: Vec<Out> = inputs.iter().map(|t| Out::Tensor(t.v)).collect();
    let mut draws = Draws { state: args.get("generator").and_then(|a| if let Arg::Generator(v) = a { Some(*v) } else { None }), next: 0 };
    // The newest value written into each input by a copy_ node.
    let mut written: Vec<Option<stablehlo::Value>> = vec![None; g.num_inputs];
    let outs = lower(cx, &g, inputs, &mut draws, &mut written)?;
    // A serialized kernel is a program of its own: the compiler runs it between programs.
    check!(cx.module_override.is_none(), Runtime, "torchtpu.compile: a serialized kernel cannot join a graph's program");
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

/// Lowers a graph's nodes on `inputs` and returns its outputs (None for an output that is
/// None: a joint graph's gradients of integer inputs). `written` gets the newest value each
/// input's copy_ nodes wrote. Subgraphs (the branches of cond, the body of while_loop, flex
/// attention's functions) are lowered the same way inside their regions.
pub(crate) fn lower_optional(cx: &mut Cx, g: &Graph, inputs: Vec<Out>, draws: &mut Draws, written: &mut [Option<stablehlo::Value>]) -> Result<Vec<Option<stablehlo::Value>>> {
    let mut values = inputs;
    for node in &g.nodes {
        let value = match node.target.as_str() {
            "torchtpu::rng_stream" => Out::Tensor(draws.stream(cx)?),
            "higher_order::cond" => control::cond(cx, &values, node, draws)?,
            "higher_order::while_loop" => control::while_loop(cx, &values, node, draws)?,
            "higher_order::flex_attention" => flex_attention::forward(cx, &values, node, draws)?,
            "higher_order::flex_attention_backward" => flex_attention::backward(cx, &values, node, draws)?,
            _ => lower_node(cx, &values, node, draws)?,
        };
        if node.target == "aten::copy_" {
            if let (Some(GArg::Ref(i)), Out::Tensor(v)) = (node.args.first(), &value) {
                if let Some(w) = written.get_mut(*i) {
                    *w = Some(*v);
                }
            }
        }
        values.push(value);
    }
    let mut outs = Vec::with_capacity(g.outputs.len());
    for o in &g.outputs {
        match arg(cx, &values, o, draws)? {
            Arg::Tensor(t) => outs.push(Some(t.v)),
            Arg::None => outs.push(None),
            other => bail!(Runtime, "torchtpu.compile: graph output {:?} is not a tensor", other),
        }
    }
    Ok(outs)
}

/// `lower_optional`'s outputs, every one a tensor.
pub(crate) fn lower(cx: &mut Cx, g: &Graph, inputs: Vec<Out>, draws: &mut Draws, written: &mut [Option<stablehlo::Value>]) -> Result<Vec<stablehlo::Value>> {
    lower_optional(cx, g, inputs, draws, written)?
        .into_iter()
        .map(|o| o.ok_or_else(|| crate::TorchError::new(crate::ErrorKind::Runtime, "torchtpu.compile: graph output None is not a tensor")))
        .collect()
}

/// One aten node: its lowering on the node's arguments; several results become one list value
/// (read with `GArg::Item`).
fn lower_node(cx: &mut Cx, values: &[Out], node: &Node, draws: &mut Draws) -> Result<Out> {
    let base = crate::base_name(&node.target);
    let lowering = match crate::registry().get(base) {
        Some(l) => *l,
        None => bail!(NotImplemented, "torchtpu.compile: no lowering for {} in a compiled graph", node.target),
    };
    let vals: Vec<Arg> = node.args.iter().map(|a| arg(cx, values, a, draws)).collect::<Result<_>>()?;
    // What a lowering cannot do in a graph is said as the compiler's refusal, so that the
    // backend runs the graph eagerly instead (dynamo.py).
    let args = Args { op: base, names: &node.arg_names, values: &vals, strides: &[] };
    let outs = crate::float4::check(&lowering, &args).and_then(|()| (lowering.f)(cx, &args)).map_err(|e| match e.kind {
        crate::error::ErrorKind::NotImplemented if !e.message.starts_with("torchtpu.compile:") => {
            crate::error::TorchError { kind: e.kind, message: format!("torchtpu.compile: {}: {}", node.target, e.message) }
        }
        _ => e,
    })?;
    Ok(match outs.len() {
        1 => outs.into_iter().next().unwrap(),
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
    })
}

fn tensor(cx: &Cx, v: stablehlo::Value) -> Arg {
    let dtype = cx.dtype(v);
    let rank = if cx.dims(v).is_empty() { Rank::ZeroDim } else { Rank::Dim };
    Arg::Tensor(Tensor { v, dtype, rank })
}

/// The random streams of one graph call. The call's state is (key, counter), its key unique to
/// the generator's (seed, offset); node k draws from counter offset + k * 2^40, so streams of
/// one call never overlap (a node would need 2^40 draws to reach the next one's).
pub(crate) struct Draws {
    state: Option<stablehlo::Value>,
    next: i64,
}

impl Draws {
    pub(crate) fn stream(&mut self, cx: &mut Cx) -> Result<stablehlo::Value> {
        let Some(state) = self.state else {
            bail!(Runtime, "torchtpu.compile: this graph draws random numbers; run it with run_graph.random")
        };
        check!(self.next < 1 << 23, Runtime, "torchtpu.compile: more than 2^23 random ops in one graph");
        let step = cx.constant_array_i64(&[0, self.next << 40], &[2], stablehlo::ElemType::U64);
        self.next += 1;
        Ok(cx.add(state, step))
    }
}

pub(crate) fn arg(cx: &mut Cx, values: &[Out], a: &GArg, draws: &mut Draws) -> Result<Arg> {
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
        GArg::List(items) => Arg::List(items.iter().map(|x| arg(cx, values, x, draws)).collect::<Result<_>>()?),
        GArg::Graph(_) => bail!(Runtime, "torchtpu.compile: a subgraph is only an argument of cond, while_loop and flex attention"),
        GArg::Generator(None) => Arg::Generator(draws.stream(cx)?),
        GArg::Generator(Some(i)) => match values.get(*i) {
            Some(Out::Tensor(v)) if cx.dtype(*v) == DType::U64 && cx.dims(*v) == [2] => Arg::Generator(*v),
            _ => bail!(Runtime, "torchtpu.compile: value {} is not a generator state (uint64 of shape [2])", i),
        },
    })
}
