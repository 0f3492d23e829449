"""Cost-model terms (bench.models.terms, bench.models.collective_terms) and every suite model's `predict`: sizes, one rank, message counts."""
import pytest

from bench.models import collective_terms, get_model, terms
from bench.models import svm as svm_model
from tests.bench.report_rows import BIG, calibration
from tests.mpitools import combination

ALPHA, OVERHEAD = 1e-5, 1e-6
#: Every message costs ALPHA + OVERHEAD from Python, ALPHA inside MPI; nothing else costs anything.
LATENCY_ONLY = dict(calibration(alpha=ALPHA, beta=0, gamma=0, overhead=OVERHEAD, copy=0, rate=1e30), kernel_rows=1e30,
                    dp_step={"float64": [[32, [OVERHEAD] * 2], [256, [OVERHEAD] * 2]]})  # no fixed cost per step
MESSAGE = ALPHA + OVERHEAD
SVM_POINT = dict(n_iter=10, n_features=784)


def test_interpolate_is_flat_below_linear_between_and_extrapolated_above():
    table = [[8, 1.0], [16, 2.0], [32, 6.0]]
    assert terms.interpolate(table, 1) == 1.0
    assert terms.interpolate(table, 12) == pytest.approx(1.5)
    assert terms.interpolate(table, 64) == pytest.approx(14.0)


def test_a_message_one_way_is_the_oneway_round_less_its_acknowledgement_or_half_a_ping_pong():
    calib = calibration()  # no oneway table: the ping-pong's half round trip
    assert terms.message(calib, 1 << 20) == terms.pingpong(calib, 1 << 20)
    calib["oneway"] = [[8, 5e-6], [512, 4e-6], [4096, 6e-6], [1 << 22, 3e-4]]  # the acknowledgement: half of 4 us
    assert terms.message(calib, 4096) == pytest.approx(4e-6) and terms.message(calib, 1 << 22) == pytest.approx(2.98e-4)
    assert terms.message(calib, 8) == pytest.approx(3e-6)
    assert terms.pingpong(calib, 8) == terms.interpolate(calib["pingpong"], 8)  # p2p's latency keeps the ping-pong


@pytest.mark.parametrize("ranks, algorithm, messages, steps", [
    (2, "ring", 2, 1), (4, "ring", 6, 3), (3, "ring", 4, 2), (4, "recursive_doubling", 2, 2),
    (3, "recursive_doubling", 3, 1), (4, "rabenseifner", 4, 2), (4, "tree", 4, 2), (4, "mpi", 2, 0),
])
def test_allreduce_counts_messages_and_reductions(ranks, algorithm, messages, steps):
    calib = calibration(alpha=ALPHA, beta=0, gamma=0, overhead=OVERHEAD, copy=0, rate=1e30)
    calib["reduce"] = [[1, 1e-3], [1 << 24, 1e-3]]  # every reduction 1 ms
    reductions = steps + (1 if ranks == 3 and algorithm != "ring" else 0)
    if algorithm == "mpi":  # the library's two-rank time (its reductions inside), scaled by its steps
        expected = OVERHEAD + ALPHA * messages
    else:  # the call's Python path, then a Python message and a NumPy reduction per step
        expected = OVERHEAD + messages * (ALPHA + OVERHEAD) + reductions * 1e-3
    assert collective_terms.allreduce(calib, 1024, ranks, algorithm) == pytest.approx(expected)


@pytest.mark.parametrize("algorithm, clean, fresh", [
    ("ring", 1, 1), ("hierarchical", 1, 1), ("rabenseifner", 1, 1), ("recursive_doubling", 1, 0), ("tree", 1, 1),
])
def test_a_hand_written_allreduce_sends_what_it_reduced_at_the_fresh_exchange_time(algorithm, clean, fresh):
    """Reductions and copies free; on 2 ranks a clean exchange 1 us, one of bytes the call (or its caller, just
    before) wrote 3 us: the ring and Rabenseifner send their input, then the half they reduced; recursive
    doubling its input once; the tree its input up and its result down, one-way messages at the ping-pong's
    one-way time, the second with what writing cost the exchange (2 us)."""
    calib = dict(calibration(alpha=ALPHA, beta=0, gamma=0, overhead=OVERHEAD, copy=0, rate=1e30),
                 exchange=[[1, 1e-6], [BIG, 1e-6]], exchange_fresh=[[1, 3e-6], [BIG, 3e-6]])
    step = MESSAGE if algorithm == "tree" else 1e-6  # a clean step: the tree's message up, the others' exchange
    expected = OVERHEAD + clean * step + fresh * (step + 2e-6)
    assert collective_terms.allreduce(calib, 1 << 20, 2, algorithm) == pytest.approx(expected)
    # gradients the backward pass has just written: the first exchange (or message) of them is fresh too
    assert collective_terms.allreduce(calib, 1 << 20, 2, algorithm, written=True) == pytest.approx(
        expected + clean * 2e-6)
    del calib["exchange_fresh"]  # an older calibration: every exchange clean
    assert collective_terms.allreduce(calib, 1 << 20, 2, algorithm) == pytest.approx(expected - fresh * 2e-6)


def test_the_allreduce_formulas_price_the_algorithms_steps_as_their_schedules_do():
    """Closed forms (instant at a million ranks) equal to `collective_terms.hand_written` on the schedules: every
    term distinct (clean and fresh exchanges, one-way messages, reductions), 2 to 19 ranks."""
    from parallel.collectives import ALLREDUCE_SCHEDULES

    calib = dict(calibration(alpha=3e-6, beta=1e-10, gamma=2e-11, overhead=2e-7, copy=0),
                 exchange=[[1, 1e-6], [BIG, 1e-6 + BIG * 1e-10]], exchange_fresh=[[1, 2e-6], [BIG, 2e-6 + BIG * 3e-10]])
    for algorithm, build in ALLREDUCE_SCHEDULES.items():
        for ranks in range(2, 20):
            for items in (ranks << 12, ranks * 5 << 14):  # blocks of whole halvings
                with combination(algorithm, ranks, items):
                    assert collective_terms.allreduce(calib, 8 * items, ranks, algorithm) == pytest.approx(
                        collective_terms.hand_written(calib, build, ranks, items, 8), rel=1e-9)


def test_gemm_rate_follows_threads_and_table():
    calib = calibration(rate=1e10, cores=2)
    assert terms.gemm(calib, 100, 100, 100, 1) == pytest.approx(2e6 / 2e10)  # 2 threads on 1 rank
    assert terms.gemm(calib, 100, 100, 100, 2) == pytest.approx(2e6 / 1e10)  # 1 thread each on 2 ranks
    assert terms.gemm(calib, 0, 100, 100, 2) == 0.0


def test_a_thin_product_runs_at_the_calibrated_thin_rate_and_a_square_one_as_before():
    calib = calibration(rate=1e10, cores=2)
    assert terms.thin_efficiency(calib, 0.01, 1) == 1.0    # a calibration without thin products
    side = 256
    calib.update(gemm_thin={"float64": [[2.5e9, 5e9], [5e9, 1e10]]}, thin_rows=[4, 64], thin_side=side)
    for rows, rate in ((4, 2.5e9), (64, 5e9)):    # 1 thread on each of 2 ranks: the table's first column
        assert terms.gemm(calib, rows, side, side, 2) == pytest.approx(2 * rows * side**2 / rate)
        assert terms.gemm(calib, side, side, rows, 2) == pytest.approx(2 * rows * side**2 / rate)  # any side thin
    assert terms.gemm(calib, 2, side, side, 2) == pytest.approx(2 * 2 * side**2 / 2.5e9)  # the thinnest's below
    assert terms.gemm(calib, 100, 100, 100, 2) == pytest.approx(2e6 / 1e10)  # square: the square rate
    between = terms.thin_efficiency(calib, 0.5, 2)
    assert terms.thin_efficiency(calib, 64 / (64 * side**2) ** (1 / 3), 2) == pytest.approx(0.5)
    assert 0.5 < between < 1.0


@pytest.mark.parametrize("suite", ["allgather", "reduce_scatter", "alltoall", "bcast", "reduce"])
def test_mpis_collective_is_its_calibrated_call_on_two_ranks_grown_as_its_algorithm(suite):
    calib, n = calibration(), 1 << 16
    formula = getattr(collective_terms, suite)
    model = get_model(suite)
    assert model.library(calib, n, 4) == pytest.approx(formula(calib, n, 4))    # no table: the formula
    calib["library"] = {suite: [[8, 5e-6], [1 << 20, 1e-3]]}
    measured = 5e-6 + (1e-3 - 5e-6) * (n - 8) / ((1 << 20) - 8)
    assert model.library(calib, n, 2) == pytest.approx(measured)
    overhead = calib["overhead_s"]
    growth = (formula(calib, n, 4) - overhead) / (formula(calib, n, 2) - overhead)
    assert growth > 1 and model.library(calib, n, 4) == pytest.approx(overhead + (measured - overhead) * growth)
    assert model.library(calib, n, 1) == pytest.approx(formula(calib, n, 1))


def test_ranks_sharing_the_node_pay_what_sharing_cost_in_the_calibration():
    calib = calibration(rate=1e10, cores=2)
    calib["busy"] = dict(ranks=2, threads=1, gemm={"float64": [5e9] * 6}, reduce=[[1, 1.0], [BIG, 1.0]],
                         copy=calib["copy"])
    assert terms.gemm(calib, 100, 100, 100, 1) == pytest.approx(2e6 / 2e10)  # alone: 2 threads
    assert terms.gemm(calib, 100, 100, 100, 2) == pytest.approx(2e6 / 5e9)   # 1 thread, at half its alone rate
    assert terms.reduction(calib, 8) < 1e-6 and terms.reduction(dict(calib, point_ranks=2), 8) == 1.0


def test_kernel_rows_follow_threads_sharing_and_an_older_files_one_number():
    calib = calibration(cores=2)  # kernel_rows [1e7, 2e7]
    assert terms.kernel_rows(calib, 1) == pytest.approx(2e7) and terms.kernel_rows(calib, 2) == pytest.approx(1e7)
    calib["busy"] = dict(ranks=2, threads=1, kernel_rows=4e6, copy=calib["copy"], reduce=calib["reduce"])
    assert terms.kernel_rows(calib, 2) == pytest.approx(4e6) and terms.kernel_rows(calib, 1) == pytest.approx(2e7)
    assert terms.kernel_rows(dict(calib, kernel_rows=3e6), 2) == 3e6


@pytest.mark.parametrize("variant, ranks, rows, cols", [("numpy", 1, 1000, 1000), ("rows", 3, 334, 1000),
                                                       ("cols", 3, 1000, 334), ("2d", 4, 500, 500),
                                                       ("2d", 3, 334, 1000)])
def test_gemv_reads_the_busiest_block_at_the_calibrated_gemv_time_and_an_older_file_as_a_copy(variant, ranks, rows,
                                                                                               cols):
    calib, model = calibration(cores=2), get_model("gemv")
    cost = model.cost(variant, 1000, ranks)
    assert terms.gemv(calib, 1 << 20, 1) is None  # an older file: the copy rule
    assert model.compute_seconds(calib, cost, variant, 1000, ranks) == terms.copy(calib, cost.stream_words * 4)
    calib["gemv"] = {"float64": [[1, [1e-6, 1e-6]], [BIG, [2e-3, 1e-3]]]}
    assert terms.gemv(calib, BIG, 1) == pytest.approx(1e-3)  # one rank: every core's threads
    calib["busy"] = dict(ranks=2, threads=1, gemv={"float64": [[1, 1e-6], [BIG, 4e-3]]}, copy=calib["copy"],
                         reduce=calib["reduce"])
    assert terms.gemv(calib, BIG, 2) == pytest.approx(4e-3)  # ranks sharing the node: the busy table
    assert model.compute_seconds(calib, cost, variant, 1000, ranks) == terms.gemv(calib, 8 * rows * cols, ranks)
    assert model.compute_seconds(dict(calib, point_dtype="float32"), cost, variant, 1000, ranks) == \
        terms.gemv(calib, 4 * rows * cols, ranks)  # the float64 table by bytes where the file has no float32 one


@pytest.mark.parametrize("variant, ranks, calls", [
    ("rows", 3, [("allgather", 1000 * 8, 3)]), ("cols", 3, [("reduce_scatter", 1000 * 8, 3)]),
    ("2d", 2, [("allgather", 1000 * 8, 2), ("reduce_scatter", 500 * 8, 1)]),  # a 2 x 1 grid
    ("2d", 6, [("allgather", 500 * 8, 3), ("reduce_scatter", 334 * 8, 2)]),  # a 3 x 2 grid
    ("rows", 1, [("allgather", 8000, 1)])])
def test_gemv_prices_mpis_allgatherv_and_reduce_scatter_at_their_calibrated_calls(variant, ranks, calls):
    calib, model = calibration(cores=2), get_model("gemv")
    formulas = {"allgather": collective_terms.allgather, "reduce_scatter": collective_terms.reduce_scatter}
    expected = sum(collective_terms.library(calib, name, nbytes, p, formulas[name]) for name, nbytes, p in calls)
    cost = model.cost(variant, 1000, ranks)
    assert model.communication_seconds(calib, cost, variant, 1000, ranks) == pytest.approx(expected)
    calib["library"] = {"allgather": [[1, 1e-3], [BIG, 1e-3]], "reduce_scatter": [[1, 2e-3], [BIG, 2e-3]]}
    measured = sum(collective_terms.library(calib, name, nbytes, p, formulas[name]) for name, nbytes, p in calls)
    assert measured > expected if ranks > 1 else measured == expected  # one rank: the formula, a call alone
    assert model.communication_seconds(calib, cost, variant, 1000, ranks) == measured
    half = model.communication_seconds(dict(calib, point_dtype="float32"), cost, variant, 1000, ranks)
    assert half == pytest.approx(sum(collective_terms.library(calib, name, nbytes / 2, p, formulas[name])
                                     for name, nbytes, p in calls))  # float32 entries
    assert model.communication_seconds(calib, model.cost("numpy", 1000, 1), "numpy", 1000, 1) == 0.0


def test_gemm_prices_mpis_allgatherv_and_panel_broadcasts_at_their_calibrated_calls():
    calib, model = calibration(cores=2), get_model("gemm")
    calib["library"] = {"allgather": [[1, 1e-3], [BIG, 1e-3]], "bcast": [[1, 2e-3], [BIG, 2e-3]]}

    def compute(variant):
        return model.compute_seconds(calib, model.cost(variant, 1000, 2), variant, 1000, 2)
    overhead = calib["overhead_s"]
    assert model.predict("1d_allgather", 1000, 2, calib) == pytest.approx(overhead + 1e-3 + compute("1d_allgather"))
    assert model.grid_dims("summa", 2) == (2, 1)  # B's panels broadcast along the grid column of 2 ranks
    assert model.predict("summa", 1000, 2, calib) == pytest.approx(overhead + (4 + 1) * 2e-3 + compute("summa"))
    # look-ahead: the panels cut at B's block boundary 500, two of at most 256 on each side
    assert model.predict("summa_lookahead", 1000, 2, calib) == pytest.approx(overhead + 4 * 2e-3 +
                                                                             compute("summa_lookahead"))
    ring = model.cost("1d_ring", 1000, 2)  # a ring's messages: one-way times, as before
    assert model.predict("1d_ring", 1000, 2, calib) == pytest.approx(
        overhead + terms.message(calib, ring.words * 8) + compute("1d_ring"))


def test_a_read_pass_is_the_gemv_of_its_bytes_or_half_a_copy_and_prices_blas1s_reads():
    calib, blas1 = calibration(cores=2), get_model("blas1")
    assert terms.read(calib, 1 << 20, 2) == terms.copy(calib, 1 << 19)  # no GEMV table: half a copy
    calib["gemv"] = {"float64": [[1, [1e-6, 1e-6]], [BIG, [2e-3, 1e-3]]]}
    assert terms.read(calib, BIG, 1) == terms.gemv(calib, BIG, 1) == pytest.approx(1e-3)
    block = 8 * 500  # 1000 entries on 2 ranks
    plain = dict(calibration(alpha=0, beta=0, gamma=0, overhead=0, cores=2), gemv=calib["gemv"])  # the passes alone
    assert blas1.predict("dot", 1000, 2, plain) == pytest.approx(terms.read(plain, 2 * block, 2))
    assert blas1.predict("nrm2", 1000, 2, plain) == pytest.approx(3 * terms.read(plain, block, 2))


def test_a_moe_step_table_adds_its_fixed_cost_to_the_terms_of_every_point():
    """Calibrated one-rank top1 steps that are the model's own terms plus 1 ms: every point gains that 1 ms
    (the scale stays 1); a calibration without them prices the terms alone."""
    calib, model = calibration(cores=1), get_model("moe")

    def step(tokens):
        return model._local(calib, 1, tokens, 1, 1) + model._messages(calib, 1, tokens, 1) + 1e-3
    with_steps = dict(calib, moe_step={"float64": [[count, [step(count)] * 2] for count in (128, 1024)]})
    for variant, tokens, ranks in (("top1", 512, 1), ("top2", 4096, 2), ("top1", 100, 3)):
        assert model.predict(variant, tokens, ranks, with_steps) == pytest.approx(
            model.predict(variant, tokens, ranks, calib) + 1e-3)


def test_hybrid_counts_each_blocks_weight_gradients_per_micro_batch_and_the_update_passes():
    """Copies alone cost (1 ns a byte): the activations' element-wise steps, per micro-batch and block its weight
    gradients written and summed, then the sums copied to the layers and the update's scaled copy."""
    calib = calibration(alpha=0, beta=0, gamma=0, overhead=0, copy=1e-9, rate=1e30)
    rows, hidden, ffn, blocks, micro_batches = 16, 512, 2048, 4, 4  # 64 samples; the suite's defaults
    activations = 3 * 8 * rows * (ffn + hidden)                      # forward once, backward twice
    block = 8 * (2 * hidden * ffn + ffn + hidden)
    expected = micro_batches * blocks * (activations + block) + 2 * blocks * block
    assert get_model("hybrid").predict("dp", 64, 1, calib) * 1e9 == pytest.approx(expected, rel=1e-6)


def test_pp_writes_its_stages_weight_gradients_every_micro_batch():
    """Copies alone cost (1 ns a byte): per micro-batch the activations' element-wise steps and the weight
    gradients written, then the step's zeroing (half a copy), copy out and scaled update."""
    calib = calibration(alpha=0, beta=0, gamma=0, overhead=0, copy=1e-9, rate=1e30)
    rows, width, linears, micro_batches = 8, 1024, 8, 8  # 64 samples; the suite's defaults on one stage
    weights = 8 * linears * (width + 1) * width
    expected = micro_batches * (linears * 3 * 8 * rows * width + weights) + 2.5 * weights
    assert get_model("pp").predict("gpipe", 64, 1, calib) * 1e9 == pytest.approx(expected, rel=1e-6)


def test_dis_smo_prices_the_rows_its_cache_computed():
    calib = dict(LATENCY_ONLY, kernel_rows=[1e6, 1e6], reduce=[[1, 0.0], [BIG, 0.0]])  # calls and passes free

    def predict(**params):
        return get_model("svm").predict("dis_smo", 1000, 2, dict(calib, point_params=dict(SVM_POINT, **params)))
    assert predict(kernel_rows=17) - predict(kernel_rows=7) == pytest.approx(10 * 500 / 1e6)  # n / p columns each
    assert predict() == pytest.approx(predict(kernel_rows=20))  # a file without them: two rows per iteration


def test_a_kernel_row_pays_its_calls_whole_and_its_columns_at_the_calibrated_rate_less_them():
    """Messages and passes free, each small NumPy call 1 us: a row of the calibrated width (2000 columns, 4000
    samples on 2 ranks) at the calibrated rate, calls included; a narrower one pays the calls whole."""
    call, rate = 1e-6, 1e6
    calib = dict(LATENCY_ONLY, kernel_rows=[rate, rate], reduce=[[1, call], [BIG, call]])

    def row(size, **params):
        def predict(rows):
            point = dict(SVM_POINT, kernel_rows=rows, **params)
            return get_model("svm").predict("dis_smo", size, 2, dict(calib, point_params=point))
        return predict(2) - predict(1)
    assert row(4000) == pytest.approx(svm_model.KERNEL_COLUMNS / rate)
    entry = 1 / rate - svm_model.ROW_CALLS * call / svm_model.KERNEL_COLUMNS
    assert row(500) == pytest.approx(svm_model.ROW_CALLS * call + 250 * entry)
    assert row(500, n_features=1568) == pytest.approx(svm_model.ROW_CALLS * call + 2 * 250 * entry)


def test_dis_smo_prices_its_python_reduction_op_at_every_step_of_each_allreduce():
    call = 1e-6  # messages and passes free, each small NumPy call a microsecond
    calib = dict(calibration(alpha=0, beta=0, gamma=0, overhead=0, copy=0, rate=1e30), kernel_rows=1e30,
                 reduce=[[1, call], [BIG, call]], point_params=SVM_POINT)
    model = get_model("svm")
    added = model.predict("dis_smo", 1000, 4, calib) - model.predict("dis_smo", 1000, 2, calib)
    assert added == pytest.approx(SVM_POINT["n_iter"] * 2 * svm_model.OP_CALLS * call)  # log2 4 - log2 2 steps


def test_dis_smo_iterations_follow_the_calibrated_ones_through_its_block():
    """Messages, calls and rows free, a pass a nanosecond a byte: the iteration's local work on the line
    through the calibrated iterations (100 us at 500 samples, 250 us at 2000), at the rank's block."""
    calib = dict(calibration(alpha=0, beta=0, gamma=0, overhead=0, copy=1e-9, rate=1e30), kernel_rows=1e30,
                 reduce=[[1, 0.0], [BIG, 0.0]], point_params=SVM_POINT)
    model = get_model("svm")

    def iterations(size, ranks):  # the prediction less the candidates' MPI allreduces and the final gather
        return model.predict("dis_smo", size, ranks, calib) - collective_terms.allgather(calib, 8 * size, ranks) - \
            SVM_POINT["n_iter"] * sum(collective_terms.allreduce(calib, n, ranks) for n in svm_model.CANDIDATE_BYTES)
    assert iterations(1000, 1) == pytest.approx(SVM_POINT["n_iter"] * svm_model.PASSES * 8 * 1000 * 1e-9)
    calib["smo_iteration"] = {"float64": [[500, [1e-4, 1e-4]], [2000, [2.5e-4, 2.5e-4]]]}
    for size, ranks in ((1000, 1), (2000, 2), (4000, 4)):
        assert iterations(size, ranks) == pytest.approx(SVM_POINT["n_iter"] * 1.5e-4)
    assert iterations(8000, 2) == pytest.approx(SVM_POINT["n_iter"] * 4.5e-4)  # beyond the table: along its line


def test_a_schedule_sends_what_it_wrote_at_the_fresh_exchange_time():
    """Copies free; a clean exchange 1 us, one of bytes the call wrote (received, or an op's output) 3 us."""
    from parallel.collectives.schedule import Schedule

    calib = dict(calibration(copy=0), exchange=[[1, 1e-6], [BIG, 1e-6]])
    block = (("in", slice(0, 4)), ("out", slice(0, 4)), ("out", slice(4, 8)), ("tmp", slice(0, 4)))
    steps = (Schedule().exchange(block[0], 1, block[1], 1)      # clean: the caller's input
             .exchange(block[1], 1, block[2], 1)               # fresh: received in the step before
             .copy(block[0], block[3]).exchange(block[3], 1, ("tmp", slice(4, 8)), 1)  # fresh: packed by a copy
             .exchange(("in", slice(4, 8)), 1, ("tmp", slice(8, 12)), 1))  # clean again
    assert collective_terms.schedule(calib, steps, 8) == pytest.approx(4e-6)  # no fresh table: all clean
    calib["exchange_fresh"] = [[1, 3e-6], [BIG, 3e-6]]
    assert collective_terms.schedule(calib, steps, 8) == pytest.approx(8e-6)


def test_a_schedule_pays_a_one_way_send_of_what_it_wrote_and_its_early_copies_in_full():
    """A message one way 10 us; writing its bytes first costs what it cost the exchange (3 - 1 us); an early copy
    (2 us) does not hide behind the messages (MPICH moves them inside MPI calls only)."""
    from parallel.collectives.schedule import Schedule

    calib = dict(calibration(copy=0), pingpong=[[1, 1e-5], [BIG, 1e-5]], exchange=[[1, 1e-6], [BIG, 1e-6]],
                 exchange_fresh=[[1, 3e-6], [BIG, 3e-6]])
    steps = (Schedule().step(recvs=[(("out", slice(0, 4)), 1)])           # a receive: 10 us
             .step(sends=[(("in", slice(0, 4)), 1)])                       # clean: 10 us
             .step(sends=[(("out", slice(2, 6)), 1)]))                     # part received before: 12 us
    assert collective_terms.schedule(calib, steps, 8) == pytest.approx(3.2e-5)
    calib["copy"] = [[1, 2e-6], [BIG, 2e-6]]
    early = Schedule().step([(("in", slice(0, 4)), 1)], [(("out", slice(4, 8)), 1)],
                            [("early_copy", ("in", slice(0, 4)), ("out", slice(0, 4)))])
    assert collective_terms.schedule(calib, early, 8) == pytest.approx(1e-6 + 2e-6)


def test_a_fitted_step_recovers_the_fixed_cost_and_the_scale():
    calib = calibration(cores=1)
    calib["dp_step"] = {"float64": [[10, [0.5 + 3 * 10] * 2], [100, [0.5 + 3 * 100] * 2]]}
    assert terms.fitted_step(calib, "dp_step", float, 1, 50) == pytest.approx((0.5, 3.0))
    calib["dp_step"]["float64"].append([1000, [0.5 + 3 * 100 + 2 * 900] * 2])  # steeper beyond 100 rows
    assert terms.fitted_step(calib, "dp_step", float, 1, 50) == pytest.approx((0.5, 3.0))
    assert terms.fitted_step(calib, "dp_step", float, 1, 500) == pytest.approx((0.5 + 100, 2.0))
    assert terms.fitted_step(calib, "dp_step", float, 1, 5000) == pytest.approx((0.5 + 100, 2.0))


# suite, variant, sizes (increasing), settings that make the variant modelled
MODELLED = [
    ("p2p", "latency", (8, 1024, 1 << 20), {}), ("p2p", "bandwidth", (8, 1024, 1 << 20), {}),
    ("allreduce", "ring", (8, 1024, 1 << 20), {}), ("allreduce", "mpi", (8, 1024, 1 << 20), {}),
    ("allreduce", "auto", (8, 1024, 1 << 20), {}), ("gemm", "summa", (64, 256, 1024), {}),
    ("gemv", "rows", (64, 256, 1024), {}), ("dp", "mpi", (32, 256, 1024), {}),
    ("dp", "mpi_overlap", (32, 256, 1024), {}), ("tp", "allreduce", (64, 512, 4096), {}),
    ("tp", "sequence", (64, 512, 4096), {}), ("conv", "forward", (64, 256, 1024), {}),
    ("conv", "forward_backward_overlap", (64, 256, 1024), {}), ("attention", "ring", (256, 1024, 4096), {}),
    ("attention", "ulysses", (256, 1024, 4096), {}), ("attention", "full", (256, 1024, 4096), {}),
    ("pp", "1f1b", (64, 256, 1024), {}), ("pp", "pipedream", (64, 256, 1024), {}),
    ("hybrid", "dp", (64, 256, 1024), {}), ("hybrid", "tp", (64, 256, 1024), {}),
    ("moe", "top2", (512, 2048, 8192), {}), ("ps", "sync", (64, 256, 1024), {}),
    ("svm", "dis_smo", (500, 1000, 2000), {"point_params": SVM_POINT}),
]


@pytest.mark.parametrize("suite, variant, sizes, settings", MODELLED)
def test_predictions_grow_with_size_and_are_positive_on_one_rank(suite, variant, sizes, settings):
    model, calib = get_model(suite), dict(calibration(), **settings)
    ranks = 2
    predicted = [model.predict(variant, size, ranks, calib) for size in sizes]
    assert all(p > 0 for p in predicted) and predicted == sorted(predicted) and predicted[0] < predicted[-1]
    if suite not in ("p2p", "ps"):  # both need two ranks
        assert model.predict(variant, sizes[0], 1, calib) > 0


@pytest.mark.parametrize("suite, variant, ranks, messages", [
    ("p2p", "latency", 2, 2 * (ALPHA + OVERHEAD)),
    ("p2p", "bandwidth", 2, 64 * (ALPHA + OVERHEAD)),             # a window of 64 at the calibrated gap
    ("allreduce", "ring", 4, 2 * OVERHEAD + 6 * (ALPHA + OVERHEAD)),  # the run's call, the algorithm's, 6 steps
    ("tp", "allreduce", 2, 2 * (OVERHEAD + ALPHA)),             # one MPI allreduce per pass
    ("tp", "sequence", 2, 2 * 3 * (OVERHEAD + ALPHA)),          # allgather, reduce-scatter and the counts' allgather
    ("conv", "forward", 2, 2 * (ALPHA + OVERHEAD)),             # a halo each way along the split axis
    ("conv", "forward_backward", 4, 2 * 4 * (ALPHA + OVERHEAD)),  # two axes, forward and reverse
    ("attention", "ring", 3, 2 * (ALPHA + OVERHEAD)),           # p - 1 K / V transfers, not hidden
    ("attention", "ulysses", 2, 4 * (OVERHEAD + ALPHA)),        # q, k, v in and o out
    ("dp", "mpi", 2, OVERHEAD + ALPHA),                         # one MPI allreduce, one round on 2 ranks
    ("pp", "1f1b", 2, 2 * 8 * MESSAGE),                         # an activation each way per micro-batch (m = 8)
    ("hybrid", "tp", 2, 4 * 4 * 2 * MESSAGE),                   # m = 4 micro-batches x 4 blocks x 2 allreduces
    ("moe", "top1", 2, 2 * 3 * MESSAGE + 2 * MESSAGE),          # counts, dispatch, combine per pass; 2 allreduces
    ("ps", "sync", 2, 4 * MESSAGE),                             # one worker: request, gradient, shard, end
    ("svm", "dis_smo", 2, 2 * 10 * MESSAGE + MESSAGE),          # two allreduces per iteration, the final gather
])
def test_predictions_count_the_suites_messages(suite, variant, ranks, messages):
    calib = dict(LATENCY_ONLY, point_params=SVM_POINT)
    assert get_model(suite).predict(variant, 1024, ranks, calib) == pytest.approx(messages, rel=1e-6)


@pytest.mark.parametrize("variant, params", [("dis_smo", {}), ("cascade", SVM_POINT), ("smo", SVM_POINT)])
def test_svm_is_modelled_for_dis_smo_with_its_iterations_only(variant, params):
    assert get_model("svm").predict(variant, 1000, 2, dict(calibration(), point_params=params)) is None


def test_the_point_dtype_selects_the_rates():
    calib = calibration(rate=1e10)
    calib["gemm"]["float32"] = [[2e10] * 6, [4e10] * 6]
    tp = get_model("tp")
    assert tp.predict("serial", 512, 1, dict(calib, point_dtype="float32")) < tp.predict("serial", 512, 1, calib)


@pytest.mark.parametrize("setting, value", [("MLSCALE_DP_MODEL", "cnn"), ("MLSCALE_DP_PRECISION", "float16")])
def test_unmodelled_dp_settings_predict_none(setting, value, monkeypatch):
    monkeypatch.setenv(setting, value)
    assert get_model("dp").predict("mpi", 64, 2, calibration()) is None


def test_interleaved_measurements_visit_every_item_in_turn():
    from bench.interleaved import interleaved_samples, measure_interleaved

    calls = []
    seconds = measure_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                  rounds=3, least=0)
    assert calls == ["a", "a", "b", "b"] + ["a", "b"] * 3  # a first call and a timed one each, then the rounds
    assert set(seconds) == {"a", "b"} and all(value >= 0 for value in seconds.values())
    calls.clear()
    interleaved_samples({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2, least=0,
                        warm={"b"})
    assert calls == ["a", "a", "b", "b"] + ["a", "b", "b"] * 2  # each sample of b after as many untimed calls


def test_gemm_beyond_the_calibrated_sizes_runs_at_the_largest_ones_rate():
    calib = calibration(cores=1)
    calib["gemm"]["float64"] = [[1e10, 1e10, 1e10, 1e10, 2e10, 1e10]] * 2  # falls from 512 to 1024
    assert terms.gemm(calib, 8192, 8192, 8192, 1) == pytest.approx(2 * 8192**3 / 1e10)
