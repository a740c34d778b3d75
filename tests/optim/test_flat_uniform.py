"""FlatParams.uniform() (the unmasked fused update applies) kept as Python flags by collect_grads / advance_steps /
set_step (docs/host_overhead.md round 20) instead of two NumPy reductions a step: the flags must equal the
reductions over any sequence of steps with and without gradients and of loaded step counts."""

import minidnn as mdn


def _reference(fs):
    s = fs.steps_host
    return bool(fs.has_grad.all()) and bool((s == s[0]).all())


def test_uniform_flags_follow_the_reductions():
    mdn.manual_seed(0)
    model = mdn.nn.Sequential(mdn.nn.Linear(4, 3), mdn.nn.Linear(3, 2))
    opt = mdn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    fs = opt._flat_sets[0][0]
    params = list(model.parameters())
    x = mdn.randn(5, 4)
    seen = []
    # steps: all grads, one frozen (its grad None), all again (counts now differ), all, loaded counts equalised
    for frozen in (None, 1, None, None, "load", None):
        opt.zero_grad()
        if frozen == "load":
            for j in range(len(params)):
                fs.set_step(j, 7)
            frozen = None
        model(x).sum().backward()
        if frozen is not None:
            params[frozen].grad = None
        fs.collect_grads()
        assert fs.uniform() == _reference(fs)
        seen.append(fs.uniform())
        fs.advance_steps(on_device=False)
        assert fs.steps_same == bool((fs.steps_host == fs.steps_host[0]).all())
    assert seen == [True, False, False, False, True, True]
