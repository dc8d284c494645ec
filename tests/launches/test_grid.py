"""ProcessGrid / GridLayout against layouts written out by hand, and the grid picture."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dpmp_lab as dl

pytestmark = pytest.mark.usefixtures("no_leaks")

# world 8 = pp2 x dp2 x tp2, rank = (pp * 2 + dp) * 2 + tp, written out by hand:
#   rank: (pp, dp, tp)    tp group   dp group   pp group   prev  next
WORLD8 = {
    0: ((0, 0, 0), (0, 1), (0, 2), (0, 4), None, 4),
    1: ((0, 0, 1), (0, 1), (1, 3), (1, 5), None, 5),
    2: ((0, 1, 0), (2, 3), (0, 2), (2, 6), None, 6),
    3: ((0, 1, 1), (2, 3), (1, 3), (3, 7), None, 7),
    4: ((1, 0, 0), (4, 5), (4, 6), (0, 4), 0, None),
    5: ((1, 0, 1), (4, 5), (5, 7), (1, 5), 1, None),
    6: ((1, 1, 0), (6, 7), (4, 6), (2, 6), 2, None),
    7: ((1, 1, 1), (6, 7), (5, 7), (3, 7), 3, None),
}
# world 4 = dp2 x tp2: the articles' 2D grid; a row (same tp_rank) is a DP group
WORLD4 = {
    0: ((0, 0, 0), (0, 1), (0, 2), (0,), None, None),
    1: ((0, 0, 1), (0, 1), (1, 3), (1,), None, None),
    2: ((0, 1, 0), (2, 3), (0, 2), (2,), None, None),
    3: ((0, 1, 1), (2, 3), (1, 3), (3,), None, None),
}


def _pp_dp_tp(c: dl.Coords) -> tuple[int, int, int]:
    return c.pp, c.dp, c.tp


def _layout_rows(layout: dl.GridLayout) -> dict:
    return {r: (_pp_dp_tp(layout.coords(r)), layout.group_of("tp", r), layout.group_of("dp", r),
                layout.group_of("pp", r), layout.prev_stage(r), layout.next_stage(r))
            for r in range(layout.world_size)}


def test_layout_world_8_matches_the_hand_written_table():
    layout = dl.GridLayout(dp=2, tp=2, pp=2)
    assert _layout_rows(layout) == WORLD8
    assert layout.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert layout.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert layout.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert layout.rank_of(pp=1, dp=0, tp=1) == 5


def test_layout_world_4_matches_the_hand_written_table():
    layout = dl.GridLayout(dp=2, tp=2)
    assert _layout_rows(layout) == WORLD4
    assert layout.groups("dp") == [(0, 2), (1, 3)] and layout.groups("tp") == [(0, 1), (2, 3)]


@pytest.mark.parametrize("sizes, error, words", [
    ({"dp": 0, "tp": 2}, ValueError, "dp=0: every grid dimension needs at least 1 rank"),
    ({"dp": 2, "tp": -1}, ValueError, "tp=-1"),
    ({"dp": 2.0}, TypeError, "dp must be an int"),
])
def test_bad_sizes_are_clear_errors(sizes, error, words):
    with pytest.raises(error, match=words):
        dl.GridLayout(**sizes)
    with pytest.raises(error, match=words):
        dl.viz.grid(**sizes)


def test_places_outside_the_grid_are_errors():
    layout = dl.GridLayout(dp=2, tp=2)
    with pytest.raises(ValueError, match="tp=2 is outside this grid"):
        layout.rank_of(dp=0, tp=2)
    with pytest.raises(ValueError, match="rank 4 is outside"):
        layout.coords(4)
    with pytest.raises(ValueError, match="group kind must be one of"):
        layout.groups("mp")


def build_grid(dp: int, tp: int, pp: int):
    grid = dl.ProcessGrid(dp=dp, tp=tp, pp=pp)
    with dl.trace() as t:
        for kind in ("tp", "dp", "pp"):
            dist.all_reduce(torch.ones(1), group=getattr(grid, f"{kind}_group"))
    groups = {kind: tuple(dist.get_process_group_ranks(getattr(grid, f"{kind}_group")))
              for kind in ("tp", "dp", "pp")}
    row = (_pp_dp_tp(grid.coords), grid.tp_ranks, grid.dp_ranks, grid.pp_ranks, grid.prev_stage,
           grid.next_stage)
    return row, groups, [(e.label, e.group) for e in t.events], grid.describe(), \
        grid.mesh.mesh.tolist(), str(dl.viz.grid(grid))


@pytest.mark.parametrize("world, sizes, table", [
    (8, (2, 2, 2), WORLD8),
    (4, (2, 2, 1), WORLD4),
])
def test_process_grid_groups_on_every_rank(warm, world, sizes, table):
    res = dl.launch(build_grid, *sizes, world_size=world, stream=False)
    for rank, (row, groups, traced, describe, mesh, picture) in enumerate(res.values):
        assert row == table[rank]
        assert groups == {"tp": row[1], "dp": row[2], "pp": row[3]}
        assert traced == [("tp", row[1]), ("dp", row[2]), ("pp", row[3])]
        assert f"rank {rank}: pp_rank {row[0][0]}, dp_rank {row[0][1]}" in describe
        assert f"[{rank}]" in picture   # this rank is marked in its own picture
        if world == 8:
            assert mesh == [[[[0, 1]], [[2, 3]]], [[[4, 5]], [[6, 7]]]]   # pp, dp, cp, tp


def wrong_grid():
    dl.ProcessGrid(dp=2, tp=3)


def test_grid_that_does_not_fill_the_world_is_a_value_error(warm):
    with pytest.raises(dl.LaunchError) as info:
        dl.launch(wrong_grid, world_size=4, stream=False)
    f = next(iter(info.value.failures.values()))   # the first rank to fail stops the rest
    assert f.exc_type == "ValueError"
    assert "dp * tp * pp = 2 * 3 * 1 = 6, but the world has 4 ranks" in f.message


def test_grid_outside_a_rank_points_to_the_picture():
    with pytest.raises(RuntimeError, match=r"dl\.viz\.grid\(dp=2, tp=2, pp=1\)"):
        dl.ProcessGrid(dp=2, tp=2)


def test_grid_picture_text_and_svg():
    pic = dl.viz.grid(dp=2, tp=2, pp=2)
    text = str(pic)
    assert "pipeline stage pp=1:" in text and "a row is a data-parallel (dp) group" in text
    # the articles' orientation: row tp=0 holds dp group (0, 2); column dp=0 the tp group (0,1)
    stage0 = text.split("pipeline stage pp=0:")[1].split("pipeline stage pp=1:")[0]
    assert stage0.split("\n")[2].split() == ["tp=0", "0", "2"]
    assert stage0.split("\n")[3].split() == ["tp=1", "1", "3"]
    svg = pic._repr_svg_()
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert all(f">{r}</text>" in svg for r in range(8))
    with pytest.raises(TypeError, match="takes a ProcessGrid or GridLayout"):
        dl.viz.grid("dp=2")


# world 8 = dp4 x cp2 with ep2, rank = dp_rank * 2 + cp_rank (the drawing in grid.py):
#   rank: (pp, dp, cp, tp)   cp group   dp group       ep group   ep_rank
WORLD8_CP_EP = {
    0: ((0, 0, 0, 0), (0, 1), (0, 2, 4, 6), (0, 2), 0),
    1: ((0, 0, 1, 0), (0, 1), (1, 3, 5, 7), (1, 3), 0),
    2: ((0, 1, 0, 0), (2, 3), (0, 2, 4, 6), (0, 2), 1),
    3: ((0, 1, 1, 0), (2, 3), (1, 3, 5, 7), (1, 3), 1),
    4: ((0, 2, 0, 0), (4, 5), (0, 2, 4, 6), (4, 6), 0),
    5: ((0, 2, 1, 0), (4, 5), (1, 3, 5, 7), (5, 7), 0),
    6: ((0, 3, 0, 0), (6, 7), (0, 2, 4, 6), (4, 6), 1),
    7: ((0, 3, 1, 0), (6, 7), (1, 3, 5, 7), (5, 7), 1),
}


def test_layout_with_cp_and_ep_matches_the_hand_written_table():
    layout = dl.GridLayout(dp=4, cp=2, ep=2)
    rows = {r: (tuple(layout.coords(r)), layout.group_of("cp", r), layout.group_of("dp", r),
                layout.group_of("ep", r), layout.ep_rank(r)) for r in range(8)}
    assert rows == WORLD8_CP_EP
    assert layout.groups("ep") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    # cp sits between dp and tp: with tp = 2 a cp group strides over the tp neighbours
    big = dl.GridLayout(dp=2, cp=2, tp=2, pp=2)
    assert big.groups("cp")[:2] == [(0, 2), (1, 3)] and big.group_of("tp", 5) == (4, 5)
    assert big.rank_of(pp=1, dp=1, cp=1, tp=1) == 15 and big.coords(13) == (1, 1, 0, 1)
    # a stage's neighbour holds the same cp and tp place (rank 13's cp 0, tp 1 at pp 0: rank 5)
    assert big.prev_stage(13) == 5 and big.next_stage(5) == 13
    assert dl.GridLayout(pp=2, cp=2).next_stage(1) == 3
    text = layout.describe(3)
    assert "cp groups (context parallel" in text and "ep groups (expert parallel" in text
    assert "rank 3: cp_rank 1, ep_rank 1; cp group (2,3), ep group (1,3)" in text
    assert "cp groups" not in dl.GridLayout(dp=2).describe()   # old grids read as before


def test_ep_must_divide_dp():
    with pytest.raises(ValueError, match="ep=3 must divide dp=4"):
        dl.GridLayout(dp=4, ep=3)


def test_grid_picture_with_cp_and_ep():
    text = str(dl.viz.grid(dp=4, cp=2, ep=2, highlight=3))
    panels = text.split("cp=1:")
    assert "cp=0:" in panels[0] and panels[0].split("\n")[-2].split() == ["tp=0", "0", "2", "4", "6"]
    assert panels[1].split("\n")[2].split() == ["tp=0", "1", "[3]", "5", "7"]
    assert "context-parallel (cp) group" in text and "(0,2) (1,3) (4,6) (5,7)" in text
    svg = dl.viz.grid(dp=2, cp=2, tp=2, pp=2)._repr_svg_()
    assert "stage pp=1, cp=1" in svg and all(f">{r}</text>" in svg for r in range(16))


def build_cp_ep_grid():
    grid = dl.ProcessGrid(dp=2, cp=2, ep=2)
    with dl.trace() as t:
        for kind in ("cp", "dp", "ep"):
            dist.all_reduce(torch.ones(1), group=getattr(grid, f"{kind}_group"))
    built = {kind: tuple(dist.get_process_group_ranks(getattr(grid, f"{kind}_group")))
             for kind in ("cp", "dp", "ep", "tp")}
    plain = dl.ProcessGrid(dp=4)
    return (tuple(grid.coords), grid.ep_rank, built, [(e.label, e.group) for e in t.events],
            plain.ep_group, plain.cp_ranks, repr(grid))


def test_process_grid_with_cp_and_ep(warm):
    res = dl.launch(build_cp_ep_grid, world_size=4, stream=False)
    layout = dl.GridLayout(dp=2, cp=2, ep=2)
    for rank, (coords, ep_rank, built, traced, plain_ep, plain_cp, text) in enumerate(res.values):
        assert coords == tuple(layout.coords(rank)) and ep_rank == layout.ep_rank(rank)
        assert built == {k: layout.group_of(k, rank) for k in ("cp", "dp", "ep", "tp")}
        assert built["ep"] == built["dp"]          # ep = dp here: the whole dp group
        assert traced == [(k, built[k]) for k in ("cp", "dp", "ep")]
        assert plain_ep is None and plain_cp == (rank,)   # ep = 1: no group, all experts local
        assert f"cp={coords[2]} ep={ep_rank}" in text
