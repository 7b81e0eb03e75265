"""The groups notebook 09 draws and grades are the groups `make_mesh` builds: on 4 live gloo
ranks, for every layout of 4, each rank's coordinates, cp rank and group members per dim.

    python -m pytest tests/dist/test_mesh_groups.py -q

`cpcourse.viz.mesh.groups` and the graded test of exercise 09.2 compute the groups from
`Layout.coords` (DeviceMesh's rule: slices of arange(world).view(cfg, ring, ulysses, tp) along a
dim); this launch holds that rule to the meshes torch actually makes.
"""

import pytest

from cpcourse.launch import launch
from cpcourse.support.layout import DIMS, Layout, layouts
from cpcourse.viz import mesh as vm

pytestmark = pytest.mark.dist

LAYOUTS_4 = [lay.as_dict() for lay in layouts(4)]


def mesh_worker():
    """Each rank: for every 4-rank layout, what make_mesh's mesh says about this rank."""
    import torch.distributed as dist

    from cpcourse.mesh import cp_coords, make_mesh

    out = []
    for degrees in LAYOUTS_4:
        mesh = make_mesh(**degrees)
        out.append({"coords": {d: mesh.get_local_rank(d) for d in DIMS},
                    "cp_rank": cp_coords(mesh)[0],
                    "groups": {d: dist.get_process_group_ranks(mesh.get_group(d))
                               for d in DIMS}})
    return out


def test_make_mesh_groups_are_the_drawn_groups():
    runs = launch(f"{__file__}:mesh_worker", 4, timeout=60, stream=False)
    for i, degrees in enumerate(LAYOUTS_4):
        layout = Layout(**degrees)
        for rank in range(4):
            got = runs[rank][i]
            co = layout.coords(rank)
            assert got["coords"] == co == vm.coords(layout, rank), (layout, rank)
            assert got["cp_rank"] == co["ring"] * layout.ulysses + co["ulysses"]
            for d in DIMS:
                drawn = next(g for g in vm.groups(layout, d) if rank in g)
                assert got["groups"][d] == drawn, (str(layout), rank, d)
