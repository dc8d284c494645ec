"""dl.viz.collective: the before/after pictures, checked against what torch's collectives do."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl
from dpmp_lab.viz import COLLECTIVES

ROOT = 2   # a root that is not rank 0, so a picture that ignores root= is caught


def inputs(n: int) -> list[torch.Tensor]:
    """Rank r's tensor: n powers of two no other rank uses, so every sum of pieces is unique."""
    return [2.0 ** (torch.arange(n, dtype=torch.float64) + n * r) for r in range(n)]


def run_every_collective() -> dict[str, torch.Tensor]:
    """Each collective once on this rank's tensor from inputs(); the output tensor of each."""
    r, n = dist.get_rank(), dist.get_world_size()
    x = inputs(n)[r]
    out: dict[str, torch.Tensor] = {}
    t = x.clone() if r == ROOT else torch.zeros_like(x)
    dist.broadcast(t, src=ROOT)
    out["broadcast"] = t
    t = x.clone()
    dist.reduce(t, dst=ROOT)
    out["reduce"] = t
    t = x.clone()
    dist.all_reduce(t)
    out["all_reduce"] = t
    t = x.new_empty(n * n)
    dist.all_gather_single(t, x)
    out["all_gather"] = t
    t = x.new_empty(1)
    dist.reduce_scatter_single(t, x)
    out["reduce_scatter"] = t
    t = x.new_empty(n)
    dist.all_to_all_single(t, x)
    out["all_to_all"] = t
    parts = [x.new_empty(n) for _ in range(n)] if r == ROOT else None
    dist.gather(x, parts, dst=ROOT)
    out["gather"] = torch.cat(parts) if r == ROOT else x
    t = x.new_empty(1)
    dist.scatter(t, list(torch.tensor_split(x, n)) if r == ROOT else None, src=ROOT)
    out["scatter"] = t
    t = x.new_empty(n)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (r + 1) % n),
                                    dist.P2POp(dist.irecv, t, (r - 1) % n)])
    for w in works:
        w.wait()
    out["send_recv"] = t
    return out


@pytest.mark.usefixtures("no_leaks")
def test_every_picture_predicts_what_torch_computes_on_every_rank(warm):
    n = 4
    res = dl.launch(run_every_collective, world_size=n, stream=False)
    for op in COLLECTIVES:
        root = ROOT if op in ("broadcast", "reduce", "gather", "scatter") else None
        predicted = dl.viz.collective(op, n, root=root).expected(inputs(n))
        for rank in range(n):
            got = res.values[rank][op]
            if predicted[rank] is None:          # scratch: only reduce's non-root ranks
                assert op == "reduce" and rank != ROOT
                continue
            assert torch.equal(got, predicted[rank]), (op, rank, got, predicted[rank])


@pytest.mark.parametrize("op", COLLECTIVES)
def test_every_op_draws_text_and_valid_svg(op):
    pic = dl.viz.collective(op, 3)
    text = str(pic)
    assert text.startswith(f"{op} on 3 ranks: ")
    assert all(f"\n   {r}  " in text for r in range(3))
    svg = pic._repr_svg_()
    root = ET.fromstring(svg)                     # well-formed XML
    assert root.tag.endswith("svg")
    labels = {"".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")}
    for boxes in pic.before + pic.after:
        assert set(boxes) <= labels               # every box is drawn with its label


def test_labels_say_who_holds_what():
    assert dl.viz.collective("all_reduce").after == [["x0+x1+x2+x3"]] * 4
    assert dl.viz.collective("all_gather", 2).after == [["x0", "x1"]] * 2
    rs = dl.viz.collective("reduce_scatter", 3)
    assert rs.before[1] == ["x1[0]", "x1[1]", "x1[2]"]
    assert rs.after[2] == ["x0[2]+x1[2]+x2[2]"]
    assert dl.viz.collective("all_to_all", 3).after[1] == ["x0[1]", "x1[1]", "x2[1]"]
    bc = dl.viz.collective("broadcast", root=1)
    assert bc.before == [["-"], ["x1"], ["-"], ["-"]] and bc.after == [["x1"]] * 4
    red = dl.viz.collective("reduce", 3, root=2)
    assert red.after == [["?"], ["?"], ["x0+x1+x2"]]
    assert "never read" in str(red) and "? = scratch" in str(red)
    assert dl.viz.collective("send/recv", 3).after == [["x2"], ["x0"], ["x1"]]
    assert dl.viz.collective("all_reduce", 8).after[0] == ["x0+...+x7"]


def test_svg_sums_are_striped_with_the_colours_of_their_ranks():
    svg = dl.viz.collective("all_reduce", 3)._repr_svg_()
    assert '<linearGradient id="dpmp-sum-0-1-2">' in svg
    assert svg.count('fill="url(#dpmp-sum-0-1-2)"') == 3


@pytest.mark.parametrize("call, error, words", [
    (lambda: dl.viz.collective("allreduce"), ValueError, "did you mean 'all_reduce'"),
    (lambda: dl.viz.collective("scan"), ValueError, "broadcast, reduce, all_reduce"),
    (lambda: dl.viz.collective(3), TypeError, "name of a collective"),
    (lambda: dl.viz.collective("all_reduce", 0), ValueError, "between 1 and 16"),
    (lambda: dl.viz.collective("all_reduce", 17), ValueError, "between 1 and 16"),
    (lambda: dl.viz.collective("all_reduce", 2.0), TypeError, "number of ranks"),
    (lambda: dl.viz.collective("all_reduce", root=1), ValueError, "all_reduce has no root"),
    (lambda: dl.viz.collective("broadcast", 4, root=4), ValueError, "between 0 and 3"),
    (lambda: dl.viz.collective("send_recv", 1), ValueError, "at least 2 ranks"),
    (lambda: dl.viz.collective("all_reduce", 3).expected([torch.ones(3)]), ValueError,
     "3 ranks but got 1"),
])
def test_bad_input_is_refused_with_a_sentence(call, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        call()


def test_save_writes_the_svg(tmp_path):
    path = tmp_path / "ar.svg"
    dl.viz.collective("all_reduce").save(str(path))
    assert path.read_text().startswith("<svg")
