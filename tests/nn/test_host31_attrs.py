"""Registered names found by the normal lookup (nn/module.py ``_RegistryReader``, host round 31): a module type that
registers a parameter, buffer or submodule gets a class-level reader of that name, so ``block.conv1`` no longer fails
the normal lookup before Module.__getattr__.  Every read must give what it gave before -- the instance __dict__
first, a class attribute of the name kept, a subclass's own __getattr__ asked, registries changed under the reader
seen, the same errors -- and the models the same bits with the switch on and off."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import models
from minidnn.nn import module as M
from tests.nn.test_host30_registered import assert_models_same_bits_on_and_off


@pytest.fixture(autouse=True)
def _restore():
    yield
    M.REGISTERED_ATTRS[0] = True


class Block(mdn.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = mdn.nn.Linear(3, 3)
        self.act = mdn.nn.ReLU()
        self.register_buffer("scale", mdn.tensor(np.full(3, 2.0, np.float32)))
        self.gain = mdn.nn.Parameter(mdn.tensor(np.ones(3, np.float32)))

    def forward(self, x):
        return self.act(self.lin(x)) * self.scale * self.gain


def _getattr_calls(monkeypatch):
    """The names Module.__getattr__ was asked for after a failed normal lookup (not by a reader)."""
    import sys
    calls = []
    real = M.Module.__getattr__
    reader = M._RegistryReader.__get__.__code__

    def counted(self, name):
        if sys._getframe(1).f_code is not reader:
            calls.append(name)
        return real(self, name)
    monkeypatch.setattr(M.Module, "__getattr__", counted)
    return calls


def test_readers_serve_a_users_block_and_the_zoo_without_getattr(monkeypatch):
    b = Block()
    blk = models.BasicBlock(4, 8, stride=2)
    for name in ("lin", "act", "scale", "gain"):
        assert type(vars(Block)[name]) is M._RegistryReader
    calls = _getattr_calls(monkeypatch)     # (patched once the types have their readers: a failed lookup counts)
    b(mdn.tensor(np.ones((2, 3), np.float32)))
    blk(mdn.tensor(np.ones((1, 4, 6, 6), np.float32)))
    assert calls == []
    M.REGISTERED_ATTRS[0] = False
    b(mdn.tensor(np.ones((2, 3), np.float32)))
    assert sorted(set(calls)) == ["act", "gain", "lin", "scale"]


def test_reads_equal_getattr_in_every_case():
    b = Block()
    assert b.lin is b._modules["lin"] and b.scale is b._buffers["scale"] and b.gain is b._parameters["gain"]
    other = Block()
    other._modules["lin"] = mdn.nn.Identity()           # surgery on the registry: seen
    assert isinstance(other.lin, mdn.nn.Identity) and isinstance(b.lin, mdn.nn.Linear)
    del other._modules["act"]
    with pytest.raises(AttributeError, match="'Block' object has no attribute 'act'"):
        other.act
    assert not hasattr(other, "act") and hasattr(b, "act")
    other._parameters["lin"] = p = mdn.nn.Parameter(mdn.tensor(np.zeros(1, np.float32)))    # a parameter first
    assert other.lin is p
    object.__setattr__(other, "scale", 7)               # the instance __dict__ comes first
    assert other.scale == 7 and b.scale is b._buffers["scale"]
    with pytest.raises(AttributeError):                 # the class attribute itself reads as absent
        Block.lin
    assert not hasattr(Block, "gain")
    assert "act" not in dir(other) and "act" in dir(b) and "lin" in dir(other)
    fresh = mdn.nn.Module()
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'lin'"):
        fresh.lin
    del b.act                                           # Module.__delattr__: from the registry
    with pytest.raises(AttributeError, match="'Block' object has no attribute 'act'"):
        del b.act


def test_class_attributes_subclasses_and_own_getattr_keep_their_lookup():
    class WithMethod(mdn.nn.Module):
        def __init__(self):
            super().__init__()
            self._modules["forward_hook_like"] = mdn.nn.ReLU()

        def helper(self):
            return "method"

    w = WithMethod()
    w._modules["helper"] = mdn.nn.ReLU()                # a method of that name: it keeps winning
    assert w.helper() == "method" and type(vars(WithMethod)["helper"]) is not M._RegistryReader
    M._expose(WithMethod, "helper")                     # asked directly: a class attribute of the name, no reader
    assert w.helper() == "method" and type(vars(WithMethod)["helper"]) is not M._RegistryReader

    class Sub(Block):
        pass

    s = Sub()
    assert s.lin is s._modules["lin"]                   # its own readers
    assert type(vars(Sub)["lin"]) is M._RegistryReader

    asked = []

    class OwnGetattr(Block):
        def __getattr__(self, name):
            asked.append(name)
            return super().__getattr__(name)

    o = OwnGetattr()
    asked.clear()
    assert "lin" not in vars(OwnGetattr)                # a type with its own __getattr__ gets no reader ...
    assert o.lin is o._modules["lin"] and o.act is o._modules["act"]
    assert asked == ["lin", "act"]                      # ... and Block's readers defer to it

    class Prop(mdn.nn.Module):
        @property
        def thing(self):
            return "property"

    pr = Prop()
    pr._modules["thing"] = mdn.nn.ReLU()
    M._expose(Prop, "thing")
    assert pr.thing == "property"

    class Child(Prop):
        pass
    M._expose(Child, "thing")                           # a base class's property: no reader on the subclass either
    assert Child().thing == "property" and "thing" not in vars(Child)


@pytest.mark.parametrize("name", ["resnet20", "mobilenet", "lenet5"])
def test_models_same_bits_on_and_off(name):
    assert_models_same_bits_on_and_off(name, M.REGISTERED_ATTRS)


def test_switch_takes_readers_off_and_back():
    M.REGISTERED_ATTRS[0] = False

    class Late(mdn.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = mdn.nn.ReLU()

    late = Late()
    assert "a" not in vars(Late) and isinstance(late.a, mdn.nn.ReLU)
    b = Block()
    assert "lin" not in vars(Block)                     # Block's readers taken off: __getattr__ answers
    assert b.lin is b._modules["lin"]
    M.REGISTERED_ATTRS[0] = True                        # ... and put back
    assert type(vars(Block)["lin"]) is M._RegistryReader and b.lin is b._modules["lin"]
    assert "a" not in vars(Late)                        # (made while off: no reader to put back)


def test_dir_keeps_a_plain_attribute_of_a_name_its_type_registers_elsewhere():
    class Maybe(mdn.nn.Module):
        def __init__(self, as_layer):
            super().__init__()
            if as_layer:
                self.head = mdn.nn.ReLU()
            else:
                self.head = 3                           # a plain attribute: the instance __dict__

    class Default(Maybe):
        head = None                                     # a subclass's class attribute of the name

    with_layer, plain = Maybe(True), Maybe(False)
    assert type(vars(Maybe)["head"]) is M._RegistryReader
    assert plain.head == 3 and "head" in dir(plain) and "head" in dir(with_layer)
    assert "head" in dir(Default(False))
    M.REGISTERED_ATTRS[0] = False
    assert "head" in dir(plain) and "head" in dir(Default(False))


def test_types_made_at_run_time_are_freed_with_their_instances():
    import gc
    import weakref
    refs = []
    for i in range(3):
        made = type(f"Made{i}", (mdn.nn.Module,), {})
        m = made()
        m.lin = mdn.nn.Linear(1, 1)
        assert type(vars(made)["lin"]) is M._RegistryReader
        refs.append(weakref.ref(made))
        del made, m
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_a_getattr_set_on_the_type_later_answers_as_without_readers():
    b = Block()
    asked = []
    real = M.Module.__getattr__

    def own(self, name):
        asked.append(name)
        return real(self, name)

    class Later(Block):
        pass

    later = Later()
    assert type(vars(Later)["lin"]) is M._RegistryReader
    Later.__getattr__ = own                             # set after the reader was made: Python would ask it
    assert later.lin is later._modules["lin"] and asked == ["lin"]
    assert b.lin is b._modules["lin"] and asked == ["lin"]      # (Block's own lookup untouched)


def test_a_type_whose_metaclass_refuses_class_attributes_still_registers():
    class Frozen(type):
        def __setattr__(cls, name, value):
            raise AttributeError(f"{cls.__name__} is frozen")

    class Locked(mdn.nn.Module, metaclass=Frozen):
        def __init__(self):
            super().__init__()
            self.lin = mdn.nn.Linear(2, 2)

    m = Locked()
    assert "lin" not in vars(Locked) and m.lin is m._modules["lin"] and "lin" in dir(m)
