"""Two torchrun "nodes" on this machine: cpcourse run as the ranks of the user's own torchrun.

    python -m pytest tests/dist/test_torchrun_nodes.py -q

Each test starts two torchrun agents, `--nnodes 2 --nproc-per-node 2` with a c10d rendezvous
on a free local port (which agent becomes node 0 is the rendezvous's choice), each with a
wall-clock limit, ended in a finally, and checks through a marker in their environment that
no process outlived them. This file is also the target the agents run for the mesh check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENT_TIMEOUT_S = 120
pytestmark = [pytest.mark.dist,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scans /proc")]


# --- what the ranks run (this file as the torchrun script) ----------------------------------------

def mesh_nodes() -> dict:
    """This rank's node and, for each mesh, the node of every member of its inner groups."""
    import torch.distributed as dist

    from cpcourse.mesh import make_mesh

    node = int(os.environ["GROUP_RANK"])
    nodes = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node)
    report = {"rank": dist.get_rank(), "node": node}
    for name, sizes, dims in (("ring2_ulysses2", {"ring": 2, "ulysses": 2}, ("ulysses", "ring")),
                              ("ring2_tp2", {"ring": 2, "tp": 2}, ("tp", "ring"))):
        mesh = make_mesh(**sizes)
        report[name] = {}
        for dim in dims:
            members = dist.get_process_group_ranks(mesh.get_group(dim))
            report[name][dim] = {"members": members, "nodes": [nodes[m] for m in members]}
    return report


def _mesh_main(world: int) -> None:
    """Every rank calls cpcourse.launch as a library would: it runs here, as this rank, and
    returns every rank's result on every rank; each rank prints the list it got."""
    from cpcourse.launch import launch

    results = launch(f"{__file__}:mesh_nodes", world, timeout=60)
    line = json.dumps({"rank": int(os.environ["RANK"]), "results": list(results)}) + "\n"
    os.write(1, line.encode())  # one write: the agent's two ranks share one stdout


def _failing_demo_main() -> None:
    """`cpcourse demo` as a program (sys.argv), with global rank 3's ring raising."""
    import torch.distributed as dist

    from cpcourse import cli
    from cpcourse.runs import demo

    honest = demo.rank

    def rank(req):
        if dist.get_rank() == 3:
            raise ValueError("rank 3 refuses")
        return honest(req)

    demo.rank = rank  # launch() looks the target up by name: this one runs
    sys.argv = ["cpcourse", "demo", "--json", *SMALL]
    sys.exit(cli.main())


SMALL = ["--seq-len", "50", "--heads", "2", "--head-dim", "8"]


# --- the two agents -------------------------------------------------------------------------------

def _free_port() -> int:
    from cpcourse.cli.doctor import free_port

    return free_port()


def two_nodes(tmp_path, *args: str) -> list[dict]:
    """Run `torchrun --nnodes 2 --nproc-per-node 2 ... ARGS` as two agents; per agent its exit
    code, stdout and stderr. Nothing they started is left running afterwards."""
    from cpcourse.launch.proctree import end_tree, marked

    mark = f"cpcourse-test-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                        "GROUP_RANK", "CPCOURSE_RUN_DIR")}
    env.update(CPCOURSE_TEST_MARK=mark, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
               TORCH_CPP_LOG_LEVEL="ERROR", TMPDIR=str(tmp_path))  # torchrun's leftovers there
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
           "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--monitor-interval", "0.1", *args]
    agents, files = [], []
    try:
        for n in range(2):
            out, err = (open(tmp_path / f"agent{n}.{s}", "w+") for s in ("out", "err"))  # noqa: SIM115
            files += [out, err]
            agents.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err,
                                           start_new_session=True))
        deadline = time.monotonic() + AGENT_TIMEOUT_S
        for agent in agents:
            agent.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for agent in agents:
            end_tree(agent, set(), mark, grace_s=0.0 if agent.poll() is not None else 3.0)
        stop = time.monotonic() + 5
        while marked(mark) and time.monotonic() < stop:
            time.sleep(0.1)
        left = marked(mark)
        for fh in files:
            fh.close()
    assert not left, f"processes left behind: {left}"
    return [{"code": agent.returncode,
             "out": (tmp_path / f"agent{n}.out").read_text(),
             "err": (tmp_path / f"agent{n}.err").read_text()} for n, agent in enumerate(agents)]


def _explain(agents) -> str:
    return "\n".join(f"--- agent {n} (exit {a['code']}) stdout:\n{a['out'][-3000:]}\n"
                     f"--- stderr:\n{a['err'][-3000:]}" for n, a in enumerate(agents))


# --- tests ----------------------------------------------------------------------------------------

def test_demo_runs_as_the_ranks_of_a_two_node_torchrun(tmp_path):
    """`torchrun ... -m cpcourse -- demo --nproc 4 --json`: the ring runs on the 4 ranks of the
    two agents; the agent holding rank 0 prints one JSON object, the other prints nothing."""
    from cpcourse.runs.demo import DemoRequest, inputs
    from cpcourse.sim import bytes_sent, simulate_ring

    agents = two_nodes(tmp_path, "-m", "cpcourse", "--", "demo", "--nproc", "4", "--json",
                       *SMALL)
    assert [a["code"] for a in agents] == [0, 0], _explain(agents)
    printed = [a for a in agents if a["out"].strip()]
    assert len(printed) == 1, _explain(agents)  # one report, from the agent of global rank 0
    report = json.loads(printed[0]["out"])  # exactly one JSON object on that stdout
    assert report["nproc"] == 4 and report["ok"] and report["max_abs_err"] <= 1e-5, report
    assert sorted((s["step"], s["rank"]) for s in report["steps"]) == [
        (s, r) for s in range(4) for r in range(4)]
    q, k, v = inputs(DemoRequest(nproc=4, seq_len=50, heads=2, head_dim=8))
    expected = bytes_sent(simulate_ring(q, k, v, 4).events, 4)  # what one process predicts
    assert [sum(s["bytes_sent"] for s in report["steps"] if s["rank"] == r)
            for r in range(4)] == expected
    assert not any("cpcourse: error" in a["err"] for a in agents), _explain(agents)


def test_a_failing_rank_is_one_line_and_its_peers_do_not_hang(tmp_path):
    """Rank 3 raises inside the ring: it prints one line and exits 2; its peers fail at their
    next collective (the connection closes), within seconds, and nobody prints a report."""
    start = time.monotonic()
    agents = two_nodes(tmp_path, __file__, "fail")
    assert time.monotonic() - start < 60, _explain(agents)  # not the 120 s agent limit
    assert all(a["code"] != 0 for a in agents) and not any(a["out"].strip() for a in agents)
    lines = [line for a in agents for line in a["err"].splitlines()
             if line.startswith("cpcourse: error:")]
    mine = [line for line in lines if "rank 3 raised ValueError: rank 3 refuses" in line]
    assert len(mine) == 1, _explain(agents)  # one line, on that rank, no traceback
    assert mine[0].endswith("(add --verbose for each rank's traceback)")
    assert not any('raise ValueError("rank 3 refuses")' in a["err"] for a in agents), (
        _explain(agents))  # its traceback only with --verbose


def test_mesh_inner_groups_stay_inside_a_node(tmp_path):
    """make_mesh(ring=2, ulysses=2) and make_mesh(ring=2, tp=2) over 2 nodes x 2 ranks: every
    Ulysses and TP group is on one node (its all-to-alls and all-reduces never cross the slow
    link), the ring spans both. And launch() inside the user's torchrun returns every rank's
    result on every rank."""
    pytest.importorskip("cpcourse.mesh", reason="awaits cpcourse/mesh.py (make_mesh)")
    agents = two_nodes(tmp_path, __file__)
    assert [a["code"] for a in agents] == [0, 0], _explain(agents)
    lines = [json.loads(line) for a in agents for line in a["out"].splitlines() if line.strip()]
    assert sorted(line["rank"] for line in lines) == [0, 1, 2, 3], _explain(agents)
    results = lines[0]["results"]
    assert all(line["results"] == results for line in lines)  # the same list on every rank
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert sorted(r["node"] for r in results) == [0, 0, 1, 1]
    for r in results:
        for name, inner in (("ring2_ulysses2", "ulysses"), ("ring2_tp2", "tp")):
            group = r[name][inner]
            assert len(group["members"]) == 2 and r["rank"] in group["members"], (name, r)
            assert group["nodes"] == [r["node"]] * 2, (name, r)  # inside this rank's node
            assert sorted(r[name]["ring"]["nodes"]) == [0, 1], (name, r)  # across the nodes


if __name__ == "__main__":  # run by the torchrun agents of the tests above
    if sys.argv[1:] == ["fail"]:
        _failing_demo_main()
    else:
        _mesh_main(int(os.environ["WORLD_SIZE"]))
