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


def _layout_rows(layout: dl.GridLayout) -> dict:
    return {r: (tuple(layout.coords(r)), layout.group_of("tp", r), layout.group_of("dp", r),
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
    row = (tuple(grid.coords), grid.tp_ranks, grid.dp_ranks, grid.pp_ranks, grid.prev_stage,
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
            assert mesh == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


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
