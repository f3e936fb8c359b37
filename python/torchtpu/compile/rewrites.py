"""Graph rewrites before lowering: cross-entropy's backward as one expression."""
import torch


def fuse_cross_entropy_backward(gm):
    """Rewrites cross-entropy's backward, _log_softmax_backward_data(nll_loss_backward(...)),
    as r * (one_hot - exp(log_probs)) with r each row's -weight * grad (0 where its target is
    ignored or outside [0, C)): the same value, without the one-hot gradient materialized and
    summed over every class again (`G - exp(out) * G.sum(1)`, where G.sum(1) is r). For 2-d
    log-probabilities of known size only."""
    aten = torch.ops.aten
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten._log_softmax_backward_data.default:
            continue
        grad, out, dim, dtype = node.args[:4]
        if not (isinstance(grad, torch.fx.Node) and grad.target is aten.nll_loss_backward.default
                and len(grad.users) == 1 and isinstance(out, torch.fx.Node)):
            continue
        g, logp, target, weight, reduction, ignore_index, total_weight = grad.args[:7]
        val = out.meta.get("val")
        if (not isinstance(val, torch.Tensor) or val.dim() != 2 or dim not in (1, -1) or val.dtype != dtype
                or not isinstance(val.shape[1], int) or not isinstance(reduction, int) or not isinstance(ignore_index, int)):
            continue
        classes = val.shape[1]
        acc = torch.float64 if dtype == torch.float64 else torch.float32  # as nll_loss sums
        with graph.inserting_before(node):
            def f(op, *args, **kwargs):
                return graph.call_function(op, args, kwargs)

            counted = f(aten.logical_and.default, f(aten.ne.Scalar, target, ignore_index),
                        f(aten.logical_and.default, f(aten.ge.Scalar, target, 0), f(aten.lt.Scalar, target, classes)))
            r = f(aten.neg.default, f(aten._to_copy.default, g, dtype=acc))
            if weight is not None:
                clamped = f(aten.clamp.default, target, 0, classes - 1)
                r = f(aten.mul.Tensor, r, f(aten._to_copy.default, f(aten.index_select.default, weight, 0, clamped), dtype=acc))
            if reduction == 1:  # mean
                r = f(aten.div.Tensor, r, total_weight)
            r = f(aten.where.ScalarOther, counted, r, 0.0)
            r = f(aten.unsqueeze.default, f(aten._to_copy.default, r, dtype=dtype), 1)
            classes_row = f(aten.arange.start, 0, classes, dtype=torch.int64, device=val.device)
            one_hot = f(aten._to_copy.default, f(aten.eq.Tensor, classes_row, f(aten.unsqueeze.default, target, 1)),
                        dtype=dtype)
            fused = f(aten.mul.Tensor, f(aten.sub.Tensor, one_hot, f(aten.exp.default, out)), r)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        graph.erase_node(grad)
        changed = True
    if changed:
        graph.lint()
        gm.recompile()
    return gm
