"""torch.compile backend "tpu": `torch.compile(model, backend="tpu")`.

AOTAutograd with PyTorch's core ATen decompositions gives forward and backward ATen graphs;
each is handed to the Rust lowerings (the same ones eager mode uses) as one graph, compiled
into one PJRT executable per input layout and run as the single op `torchtpu::run_graph`.

    backend         the dynamo backend, inductor's stand-in for tpu graphs, fake kernels
    graph           one ATen graph into one program (compile_graph) and its calls
    encoder         FX nodes into the records the Rust graph builder reads (control flow and
                    flex attention as nodes with subgraphs)
    host_split      the parts of a graph that run on the host or eagerly around the program
    rewrites        graph rewrites before lowering
    sizes           symbolic sizes: which graphs have them, their values per call
    diagnostics     why a frame recompiles; per-graph statistics
"""
from .backend import backend, install_as_default_for_tpu, install_fake_kernels
from .diagnostics import graph_stats
from .graph import compile_graph

__all__ = ["backend", "compile_graph", "graph_stats", "install_as_default_for_tpu", "install_fake_kernels"]
