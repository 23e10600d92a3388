"""The GPU check's result assembly (scripts/bench/gpu_results.py) against what the tools print.

  python tests/test_gpu_results.py [-k fixtures | -k real]

`fixtures` (fast): the GPU-shaped outputs in tests/fixtures/gpu_results (MXFP8 cells "n/a" as on
an H100), then the same with a missing column, a cell that is not a number, a metrics line that
is not JSON and a reader that raises: each must still write every result file, keep every
readable number, name the step and the text in an UNREADABLE row, and exit 3.
`real` (a few seconds of CPU): the tools' current output, run here: titan-bench-matmul,
titan-bench-linear (block-scaled table included), a 2-step titan-train with a validation record
and a memory snapshot read by torch.cuda._memory_viz stats; everything must be readable.
The executables come from the environment (TITAN_BENCH_MATMUL, TITAN_BENCH_LINEAR, TITAN_TRAIN;
tests/CMakeLists.txt sets them); without them the `real` case reports itself skipped.
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSEMBLER = os.path.join(ROOT, "scripts", "bench", "gpu_results.py")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "gpu_results")
sys.path.insert(0, os.path.dirname(ASSEMBLER))
import gpu_parsers  # noqa: E402
import gpu_results  # noqa: E402


class Work:
    """A gpu_check work folder: logs/<step>.log, runs/<run>/metrics.jsonl, steps.tsv."""

    def __init__(self, base):
        self.dir = os.path.join(base, "work")
        self.out = os.path.join(base, "out")
        os.makedirs(os.path.join(self.dir, "logs"))
        os.makedirs(os.path.join(self.dir, "runs"))

    def step(self, name, log_text=None, status="PASS"):
        if log_text is not None:
            with open(os.path.join(self.dir, "logs", name + ".log"), "w") as f:
                f.write(log_text)
        with open(os.path.join(self.dir, "steps.tsv"), "a") as f:
            f.write(f"{name}\t{status}\t0\t1.5\tcmd\n")

    def metrics(self, run, lines):
        os.makedirs(os.path.join(self.dir, "runs", run), exist_ok=True)
        with open(os.path.join(self.dir, "runs", run, "metrics.jsonl"), "w") as f:
            f.write("".join(line + "\n" for line in lines))

    def assemble(self):
        """(exit code, summary.txt, results.json, stderr)."""
        p = subprocess.run([sys.executable, ASSEMBLER, "--work", self.dir, "--out", self.out, "--mode", "test",
                            "--device", "test", "--bundle", self.dir], capture_output=True, text=True)
        summary = read(os.path.join(self.out, "summary.txt"))
        results = json.loads(read(os.path.join(self.out, "results.json")))
        return p.returncode, summary, results, p.stderr


def read(path):
    with open(path) as f:
        return f.read()


def fixture(name):
    return read(os.path.join(FIXTURES, name))


def metrics_line(step, loss=2.5):
    return json.dumps({"step": step, "loss": loss, "grad_norm": 1.0, "lr": 1e-4, "memory_peak_bytes": 2**30,
                       "memory_peak_pct": 1.0, "tps": 1000.0, "tokens": 8192, "tflops": 100.0,
                       "mfu_pct": 10.0, "elapsed_s": 0.5})


class Fixtures(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="titan-gpu-results-")
        self.work = Work(self.tmp)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_gpu_shaped_outputs_are_read_whole(self):
        w = self.work
        w.step("bench_matmul", fixture("bench_matmul_h100.log"))
        w.step("bench_linear", fixture("bench_linear_h100.log"))
        w.step("train_8B_4layers_bf16")
        w.metrics("train_8B_4layers_bf16", [metrics_line(s) for s in range(1, 9)])
        rc, summary, results, err = w.assemble()
        self.assertEqual(rc, 0, summary + err)
        self.assertNotIn("UNREADABLE", summary)
        self.assertEqual(len(results["bench_matmul"]), 8)
        cube = results["bench_matmul"][4]
        self.assertEqual((cube["model"], cube["M"], cube["K"], cube["N"]), ("70B", 8192, 8192, 8192))
        self.assertEqual((cube["float8_tensorwise_speedup"], cube["float8_rowwise_speedup"], cube["int8_ms"]),
                         (1.87, 1.68, 0.90))
        self.assertTrue(results["targets"]["matmul_8192_float8_tensorwise"]["met"])
        self.assertFalse(results["targets"]["matmul_8192_float8_rowwise"]["met"])
        f8 = results["bench_linear"]["float8"][0]
        self.assertEqual((f8["tensorwise_ms"], f8["tensorwise_faster"], f8["tensorwise_auto_filter"]),
                         (3.41, True, "convert"))
        self.assertAlmostEqual(f8["int8_speedup"], 4.71 / 3.95, places=12)
        self.assertAlmostEqual(results["targets"]["linear_8192_tensorwise"]["speedup"], 4.71 / 3.41, places=12)
        self.assertNotIn("linear_8192_int8", results["targets"])
        block = results["bench_linear"]["block_scaled"][0]
        self.assertEqual(block["mxfp8_cublas"], "n/a: MXFP8 GEMM needs a Bl")
        self.assertEqual((block["blockwise_ms"], block["blockwise_sqnr_out_db"],
                          block["blockwise_sqnr_grad_weight_db"]), (3.90, 29.4, 29.4))
        self.assertEqual(block["mxfp4_emulated_sqnr_grad_input_db"], 15.6)
        self.assertIn("sm100", results["bench_linear"]["not_available"]["mxfp8_cublas_rceil"])
        self.assertIn("block-scaled: hp 4.71 ms; mxfp8_emulated 0.22x", summary)
        t = results["training"]["train_8B_4layers_bf16"]
        self.assertEqual((t["steps"], t["timed_steps"], t["tps"]), (8, 5, 8192 / 0.5))
        with tarfile.open(os.path.join(w.out, "logs.tar.gz")) as tar:
            self.assertIn("logs/bench_linear.log", tar.getnames())

    def assert_unreadable(self, rc, summary, results, step, text):
        self.assertEqual(rc, gpu_results.EXIT_UNREADABLE, summary)
        self.assertIn("UNREADABLE", summary)
        rows = [r for r in results["unreadable"] if r["step"] == step and text in r["what"] + r["text"]]
        self.assertTrue(rows, f"no unreadable row for {step} with {text!r}: {results['unreadable']}")
        named = [line for line in summary.split("UNREADABLE")[1].splitlines() if step in line and text in line]
        self.assertTrue(named, summary)

    def test_missing_column_and_bad_cell_are_named_and_the_rest_kept(self):
        w = self.work
        matmul = fixture("bench_matmul_h100.log").replace("|     0.27 ms  1.48x    ", "", 1)
        linear = fixture("bench_linear_h100.log").replace("3.80 yes convert", "3.8O yes convert")
        w.step("bench_matmul", matmul)
        w.step("bench_linear", linear)
        w.step("eager_8B_4layers")
        rc, summary, results, err = w.assemble()
        self.assert_unreadable(rc, summary, results, "bench_matmul", "header has 3")
        self.assert_unreadable(rc, summary, results, "bench_linear", "3.8O yes convert")
        self.assert_unreadable(rc, summary, results, "eager_8B_4layers", "runs/eager_8B_4layers.json")
        # The short row keeps the cells it has; every other row and table is whole.
        short = results["bench_matmul"][0]
        self.assertEqual((short["float8_tensorwise_ms"], short["float8_rowwise_ms"]), (0.25, 0.28))
        self.assertNotIn("int8_ms", short)
        self.assertEqual(len(results["bench_matmul"]), 8)
        f8 = results["bench_linear"]["float8"][0]
        self.assertTrue(f8["rowwise"].startswith("unreadable: 3.8O"))
        self.assertEqual(f8["tensorwise_ms"], 3.41)
        self.assertEqual(results["bench_linear"]["block_scaled"][0]["blockwise_ms"], 3.90)
        self.assertIn("bench_linear", summary.split("UNREADABLE")[0])  # the step's row is still there
        self.assertIn("gpu_results: unreadable output of step bench_linear", err)

    def test_broken_metrics_and_a_failing_reader_are_rows(self):
        w = self.work
        w.step("train_8B_4layers_rowwise")
        w.metrics("train_8B_4layers_rowwise", [metrics_line(1), "step: 2 loss: 2.4", metrics_line(3),
                                               json.dumps({"step": 4, "loss": 2.3})])
        w.step("bench_matmul", "garbage without a table\n")
        rc, summary, results, _ = w.assemble()
        self.assert_unreadable(rc, summary, results, "train_8B_4layers_rowwise", "step: 2 loss: 2.4")
        self.assert_unreadable(rc, summary, results, "train_8B_4layers_rowwise", '"step": 4')
        self.assert_unreadable(rc, summary, results, "bench_matmul", "garbage without a table")
        self.assertEqual(results["training"]["train_8B_4layers_rowwise"]["steps"], 2)
        # A reader that raises is itself a row naming the step (in-process: the parser replaced).
        findings = gpu_parsers.Findings()
        original = gpu_results.parse_bench_linear
        gpu_results.parse_bench_linear = lambda *a: 1 / 0
        try:
            w.step("bench_linear", fixture("bench_linear_h100.log"))
            gpu_results.assemble(w.dir, gpu_results.read_steps(w.dir, findings), {}, findings)
        finally:
            gpu_results.parse_bench_linear = original
        crash = [r for r in findings.rows if r["step"] == "bench_linear"]
        self.assertEqual(len(crash), 1, findings.rows)
        self.assertIn("reader failed", crash[0]["what"])
        self.assertIn("ZeroDivisionError", crash[0]["text"])


def tool(variable):
    path = os.environ.get(variable, "")
    return path if path and os.access(path, os.X_OK) else None


class Real(unittest.TestCase):
    """The tools' real output on this CPU, as the rehearsal runs them."""

    def test_real_cpu_outputs_are_read_whole(self):
        matmul, linear, train = (tool(v) for v in ("TITAN_BENCH_MATMUL", "TITAN_BENCH_LINEAR", "TITAN_TRAIN"))
        if not (matmul and linear and train):
            self.skipTest("TITAN_BENCH_MATMUL / TITAN_BENCH_LINEAR / TITAN_TRAIN not set to executables")
        tmp = tempfile.mkdtemp(prefix="titan-gpu-results-real-")
        try:
            self.run_real(tmp, matmul, linear, train)
        finally:
            shutil.rmtree(tmp)

    def run_real(self, tmp, matmul, linear, train):
        w = Work(tmp)
        run = lambda *cmd: subprocess.run(cmd, capture_output=True, text=True, check=True).stdout  # noqa: E731
        # The rehearsal's arguments (scripts/gpu_check.sh).
        w.step("bench_matmul", run(matmul, "--device", "cpu", "--scale", "64", "--tokens", "512", "--iters", "1"))
        w.step("bench_linear", run(linear, "--device", "cpu", "--scale", "16", "--tokens", "512", "--dims", "1024",
                                   "--iters", "1"))
        dump = os.path.join(w.dir, "runs", "cpu_train_step")
        run(train, "--job.config_file", os.path.join(ROOT, "configs", "llama3_debugmodel.toml"),
            "--training.steps", "2", "--training.seq_len", "64", "--training.local_batch_size", "2",
            "--metrics.log_freq", "1", "--job.dump_folder", dump, "--validation.enable", "--validation.dataset", "fortunes", "--validation.freq", "2",
            "--validation.steps", "1", "--validation.seq_len", "64", "--profiling.enable_memory_snapshot",
            "--profiling.profile_freq", "2")
        w.step("cpu_train_step")
        pickle = os.path.join(dump, "memory_snapshot", "iteration_2", "rank0_memory_snapshot.pickle")
        w.step("memory_snapshot", run(sys.executable, "-m", "torch.cuda._memory_viz", "stats", pickle))
        rc, summary, results, err = w.assemble()
        self.assertEqual(rc, 0, summary + err)
        self.assertNotIn("UNREADABLE", summary)
        self.assertEqual(len(results["bench_matmul"]), 8)
        for row in results["bench_matmul"]:
            for key in ("float8_tensorwise", "float8_rowwise", "int8"):
                # Times and speedups print with 2 decimals: a tiny scaled GEMM may read 0.00 ms,
                # and on a loaded CI machine one slow int8 GEMM (4.12 ms against 0.02 ms) gives a
                # speedup that prints 0.00x. What this test owns is that each cell was read as a
                # number, not its size, so both are only required to be numbers >= 0.
                self.assertIsInstance(row[key + "_ms"], float, row)
                self.assertIsInstance(row[key + "_speedup"], float, row)
                self.assertGreaterEqual(row[key + "_ms"], 0, row)
                self.assertGreaterEqual(row[key + "_speedup"], 0, row)
        f8 = results["bench_linear"]["float8"]
        self.assertEqual(len(f8), 1)
        for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp", "tensorwise_delayed", "int8"):
            self.assertGreaterEqual(f8[0][recipe + "_ms"], 0, f8[0])
        block = results["bench_linear"]["block_scaled"]
        self.assertEqual(len(block), 1)
        for recipe in ("mxfp8_cublas", "mxfp8_cublas_rceil", "mxfp8_emulated", "mxfp4_emulated", "blockwise"):
            # On the CPU every block-scaled recipe is emulated at M=32: a time and three SQNRs
            # (MXFP4's e2m1 elements: ~16 dB; the float8 ones ~27-29 dB).
            self.assertGreaterEqual(block[0][recipe + "_ms"], 0, block[0])
            self.assertGreater(block[0][recipe + "_sqnr_out_db"], 10, block[0])
        t = results["training"]["cpu_train_step"]
        self.assertEqual((t["steps"], len(t["losses"]), len(t["validation_losses"])), (2, 2, 1))
        self.assertGreater(t["tps"], 0)
        snap = results["memory_snapshot"]
        self.assertGreater(snap["segments"], 0)
        self.assertGreaterEqual(snap["total_reserved_bytes"], snap["total_allocated_bytes"])


if __name__ == "__main__":
    unittest.main()
