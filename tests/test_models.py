"""Model zoo: exact sizes, shapes, determinism, spec checking, catalog/FLOPs, kernel routing."""

from types import SimpleNamespace

import pytest
import torch

import kernels
from core.spec import ModelSpec
from workers import models
from workers.data import DataInfo


def build(family, preset, data_info=None, kernels=None, **overrides):
    return models.build(
        ModelSpec(family=family, preset=preset, overrides=overrides), data_info=data_info, kernels=kernels
    )


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def image_info(size, channels=3, classes=7):
    return DataInfo.images(classes, channels, size, train_size=1, eval_size=0)


def token_info(vocab=97, seq_len=16):
    return DataInfo.tokens(vocab, seq_len, train_size=1, eval_size=0)


ALL_PRESETS = [(f, p) for f in models.FAMILIES for p in models.presets(f)]


# --- sizes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family,preset,expected",
    [
        ("vit", "vit_b16", 86_567_656),  # timm vit_base_patch16_224
        ("resnet", "resnet50", 25_557_032),  # torchvision resnet50
        ("resnet", "seresnet50", 28_088_024),  # timm seresnet50
        # GPT-2 124M (tied lm_head counted once), its vocabulary rows padded 50257 -> 50304
        ("gpt", "gpt2_small", 124_439_808 + 47 * 768),
    ],
)
def test_exact_parameter_counts(family, preset, expected):
    with torch.device("meta"):
        model = build(family, preset)
    assert n_params(model) == expected


def test_gpt2_without_vocabulary_padding_is_exactly_gpt2_and_padding_never_shows():
    with torch.device("meta"):
        exact = models.build(
            SimpleNamespace(family="gpt", preset="gpt2_small", overrides={"vocab_multiple": 1})
        )
    assert n_params(exact) == 124_439_808
    model = models.build(
        SimpleNamespace(family="gpt", preset="gpt_nano", overrides={"vocab_multiple": 64}),
        token_info(vocab=65, seq_len=16),
    )
    assert model.wte.weight.shape[0] == 128  # 65 rounded up
    logits = model(torch.randint(65, (2, 16)))
    assert logits.shape == (2, 16, 65)  # the padding columns are never a class


def test_gpt_lm_head_is_tied():
    model = build("gpt", "gpt_nano")
    assert model.lm_head.weight is model.wte.weight


# --- forward shapes ---------------------------------------------------------------------


def _small_info(family, preset):
    if family == "gpt":
        return token_info(vocab=97, seq_len=16)
    if family == "vit":
        patch = models.make_config(family, preset).patch_size
        return image_info(2 * patch, channels=1)
    return image_info(16, channels=1)


@pytest.mark.parametrize("family,preset", ALL_PRESETS)
def test_forward_shape_every_preset(family, preset):
    info = _small_info(family, preset)
    # presets above 3M parameters run on meta: shapes without the allocation and init cost
    with torch.device("meta"):
        big = n_params(build(family, preset)) > 3_000_000
    with torch.device("meta" if big else "cpu"):
        torch.manual_seed(0)
        model = build(family, preset, data_info=info)
        if family == "gpt":
            x = torch.randint(97, (2, 16))
            expected = (2, 16, 97)
        else:
            x = torch.randn(2, 1, info.image_size, info.image_size)
            expected = (2, 7)
        out = model(x)
    assert tuple(out.shape) == expected
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) >= 1
    if not big:
        assert torch.isfinite(out).all()


def test_resnet_stem_follows_image_size():
    with torch.device("meta"):
        small = build("resnet", "resnet50", data_info=image_info(32))
        large = build("resnet", "resnet50", data_info=image_info(224))
        forced = build("resnet", "resnet50", data_info=image_info(32), small_stem=False)
    assert small.stem[0].kernel_size == (3, 3) and len(small.stem) == 3
    assert large.stem[0].kernel_size == (7, 7) and isinstance(large.stem[3], torch.nn.MaxPool2d)
    assert forced.stem[0].kernel_size == (7, 7)
    # the stem choice must not change the trunk: only the first conv differs in size
    assert n_params(large) - n_params(small) == 64 * 3 * (49 - 9)


def test_vit_conv_stem_makes_the_same_token_grid_from_strided_convolutions():
    patch = build("vit", "vit_micro", patch_size=7)
    conv = build("vit", "vit_micro", patch_size=8, stem="conv")
    x = torch.randn(2, 1, 28, 28)
    # 28 -> 14 -> 7 -> 4: three stride-2 convolutions (padded), 16 tokens as a 7px patch gives
    assert conv.pos_embed.shape == (1, 16 + 1, 128) and conv(x).shape == (2, 10)
    convs = [m for m in conv.patch_embed if isinstance(m, torch.nn.Conv2d)]
    assert [m.stride for m in convs] == [(2, 2), (2, 2), (2, 2), (1, 1)]
    assert [m.out_channels for m in convs] == [32, 64, 128, 128]  # doubling up to dim
    # the trunk is the same; only the embedding differs
    assert n_params(conv.blocks) == n_params(patch.blocks)
    assert models.check("vit", "vit_micro", {"stem": "conv", "patch_size": 7}) == [
        ("overrides.stem", "a conv stem needs a power-of-two patch_size, not 7")
    ]
    assert models.check("vit", "vit_micro", {"stem": "conv", "patch_size": 8, "dim": 130, "heads": 2}) == [
        ("overrides.stem", "a conv stem with patch_size 8 needs dim divisible by 4")
    ]


def test_blocks_are_the_repeated_units():
    assert len(build("gpt", "gpt_nano").blocks) == 3
    assert len(build("vit", "vit_micro").blocks) == 4
    with torch.device("meta"):
        assert len(build("resnet", "resnet50").blocks) == 3 + 4 + 6 + 3
    assert len(build("convnet", "convnet").blocks) == 3


# --- determinism ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "family,preset",
    [("convnet", "convnet_small"), ("resnet", "resnet_tiny"), ("vit", "vit_micro"), ("gpt", "gpt_nano")],
)
def test_init_is_deterministic_given_seed(family, preset):
    def make(seed):
        torch.manual_seed(seed)
        return build(family, preset)

    a, b, c = make(0).state_dict(), make(0).state_dict(), make(1).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


# --- kernels routing ------------------------------------------------------------------


@pytest.mark.parametrize("family,preset", [("vit", "vit_micro"), ("gpt", "gpt_nano")])
def test_explicit_torch_kernels_match_default(family, preset):
    x = torch.randint(256, (2, 32)) if family == "gpt" else torch.randn(2, 1, 28, 28)
    torch.manual_seed(0)
    default = build(family, preset).eval()
    torch.manual_seed(0)
    explicit = build(family, preset, kernels={"layer_norm": "torch", "attention": "torch"}).eval()
    torch.manual_seed(0)
    fused = build(family, preset, kernels={"bias_gelu": "torch"}).eval()
    with torch.no_grad():
        assert torch.equal(default(x), explicit(x))
        # same parameters, fused bias + GELU: equal up to float rounding
        assert fused.state_dict().keys() == default.state_dict().keys()
        torch.testing.assert_close(fused(x), default(x), rtol=1e-5, atol=1e-5)


def test_ops_go_through_kernels_with_configured_impl(monkeypatch):
    calls = []

    def spy(name, real):
        def wrapper(*args, impl="auto", **kwargs):
            calls.append((name, impl))
            return real(*args, impl="torch", **kwargs)

        return wrapper

    for name in ("layer_norm", "attention", "bias_gelu"):
        monkeypatch.setattr(kernels, name, spy(name, getattr(kernels, name)))
    model = build("gpt", "gpt_nano", kernels={"attention": "triton", "bias_gelu": "torch"})
    model(torch.randint(256, (1, 8)))
    n = model.config.n_layer
    assert calls.count(("attention", "triton")) == n
    assert calls.count(("bias_gelu", "torch")) == n
    assert calls.count(("layer_norm", "auto")) == 2 * n + 1


# --- check / make_config ------------------------------------------------------------------


def test_check_accepts_valid_specs():
    assert models.check("vit", "vit_micro", {}) == []
    assert models.check("vit", "vit_b16", {"depth": 6, "dropout": 0.1, "pool": "mean"}) == []
    assert models.check("gpt", "gpt_nano", {"kernels": {"attention": "triton"}, "dropout": 0}) == []
    assert models.check("resnet", "resnet50", {"layers": [2, 2, 2, 2], "small_stem": None}) == []


def test_check_unknown_preset_suggests():
    [(path, msg)] = models.check("vit", "vit_hug", {})
    assert path == "preset"
    assert "unknown preset 'vit_hug' for family 'vit'" in msg
    assert "did you mean 'vit_huge'?" in msg and "vit_tiny" in msg


def test_check_unknown_field_suggests():
    assert models.check("vit", "vit_tiny", {"dept": 3}) == [
        ("overrides.dept", "unknown field; did you mean 'depth'?")
    ]
    [(path, msg)] = models.check("gpt", "gpt_nano", {"zzz": 1})
    assert path == "overrides.zzz" and "n_embd" in msg


@pytest.mark.parametrize(
    "family,overrides,path,fragment",
    [
        ("vit", {"depth": "abc"}, "overrides.depth", "expected an integer, got 'abc'"),
        ("vit", {"depth": True}, "overrides.depth", "expected an integer"),
        ("vit", {"depth": 0}, "overrides.depth", "must be 1 to 1048576, got 0"),
        ("vit", {"dropout": 1.5}, "overrides.dropout", "must be in [0, 1)"),
        ("vit", {"mlp_ratio": "x"}, "overrides.mlp_ratio", "expected a number"),
        ("vit", {"pool": "max"}, "overrides.pool", "expected one of 'cls', 'mean'"),
        ("vit", {"qkv_bias": "yes"}, "overrides.qkv_bias", "expected true or false"),
        ("resnet", {"layers": [3, "a"]}, "overrides.layers", "item 1: expected an integer"),
        ("resnet", {"layers": []}, "overrides.layers", "must not be empty"),
        ("resnet", {"small_stem": 3}, "overrides.small_stem", "true or false or null"),
        ("gpt", {"kernels": {"attention": "cuda"}}, "overrides.kernels", "unknown impl 'cuda'"),
        ("gpt", {"kernels": {"atention": "torch"}}, "overrides.kernels", "did you mean 'attention'"),
    ],
)
def test_check_value_problems(family, overrides, path, fragment):
    preset = models.presets(family)[0]
    problems = models.check(family, preset, overrides)
    assert len(problems) == 1 and problems[0][0] == path and fragment in problems[0][1], problems


def test_no_two_presets_of_a_family_are_the_same_model():
    for family in models.FAMILIES:
        configs = [models.make_config(family, preset) for preset in models.presets(family)]
        assert len({repr(c) for c in configs}) == len(configs), family


@pytest.mark.parametrize("family,preset", [("convnet", "convnet"), ("resnet", "resnet_tiny")])
def test_families_without_kernel_ops_take_no_kernels_override(family, preset):
    [(path, msg)] = models.check(family, preset, {"kernels": {"attention": "triton"}})
    assert path == "overrides.kernels"
    assert f"the {family} family has no ops with fused kernels" in msg and "kernels.cross_entropy" in msg
    # the job's kernels section (for the loss) still builds these families
    cfg = models.make_config(family, preset, kernels={"cross_entropy": "torch", "attention": "triton"})
    assert not hasattr(cfg, "kernels")


@pytest.mark.parametrize("family,preset", [("vit", "vit_micro"), ("gpt", "gpt_nano")])
def test_kernel_families_take_a_kernels_override(family, preset):
    assert models.check(family, preset, {"kernels": {"attention": "torch"}}) == []
    cfg = models.make_config(
        family, preset, {"kernels": {"attention": "torch"}}, kernels={"layer_norm": "torch"}
    )
    assert cfg.kernels == {"attention": "torch", "layer_norm": "torch"}


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        ({"depth": 2**20 + 1}, "must be 1 to 1048576, got 1048577"),
        ({"depth": 10**5000}, "must be 1 to 1048576, got a huge integer"),
        ({"mlp_ratio": 10**400}, "must be > 0 and <= 1000"),
        ({"mlp_ratio": float("inf")}, "must be a finite number, got inf"),
        ({"dropout": float("nan")}, "must be a finite number, got nan"),
    ],
)
def test_check_bounds_every_number(overrides, fragment):
    [(path, msg)] = models.check("vit", "vit_micro", overrides)
    assert path == f"overrides.{next(iter(overrides))}" and fragment in msg


def test_check_cross_field_constraints():
    assert models.check("vit", "vit_b16", {"image_size": 100}) == [
        ("overrides.image_size", "image_size 100 is not divisible by patch_size 16")
    ]
    assert models.check("vit", "vit_b16", {"heads": 5}) == [
        ("overrides.heads", "dim 768 is not divisible by heads 5")
    ]
    assert models.check("gpt", "gpt_nano", {"n_embd": 50}) == [
        ("overrides.n_embd", "n_embd 50 is not divisible by n_head 3")
    ]
    # the data's shape counts too: Fashion-MNIST's 28px with a patch-16 ViT
    [(path, msg)] = models.check("vit", "vit_b16", {}, data_info=image_info(28))
    assert path == "preset" and "not divisible by patch_size 16" in msg
    assert models.check("gpt", "gpt_nano", {}, data_info=image_info(28))[0][0] == "family"


@pytest.mark.parametrize(
    "family,preset,overrides",
    [
        ("nope", "x", {}),
        (["vit"], "x", {}),
        ("vit", None, None),
        ("vit", ["vit_micro"], {}),
        ("vit", "vit_micro", "depth=3"),
        ("vit", "vit_micro", {1: 2}),
        ("vit", "vit_micro", {"kernels": ["torch"]}),
        ("resnet", "resnet50", {"layers": "3,4"}),
        ("gpt", "gpt_nano", {"n_head": 0, "n_embd": None}),
    ],
)
def test_check_never_raises(family, preset, overrides):
    assert models.check(family, preset, overrides)  # reports, does not raise


def test_make_config_precedence():
    cfg = models.make_config(
        "vit",
        "vit_micro",
        {"num_classes": 3},
        data_info=image_info(32, 3, 100),
        kernels={"attention": "torch"},
    )
    assert (cfg.image_size, cfg.in_channels, cfg.num_classes) == (32, 3, 3)  # user override wins
    assert cfg.kernels == {"attention": "torch"}
    cfg = models.make_config("gpt", "gpt_nano", data_info=token_info(vocab=65, seq_len=512))
    assert (cfg.vocab_size, cfg.block_size) == (65, 512)
    cfg = models.make_config("gpt", "gpt_nano", data_info=token_info(seq_len=16))
    assert cfg.block_size == 128  # never shrinks below the preset
    cfg = models.make_config("vit", "vit_micro", {"dropout": 0})
    assert isinstance(cfg.dropout, float)
    # presets are not mutated through configs
    models.make_config("resnet", "resnet50").layers.append(99)
    assert models.make_config("resnet", "resnet50").layers == [3, 4, 6, 3]


def test_build_rejects_invalid_spec():
    with pytest.raises(ValueError, match="model.overrides.depth: must be 1 to 1048576, got 0"):
        build("vit", "vit_micro", depth=0)
    with pytest.raises(ValueError, match="model.kernels"):
        build("vit", "vit_micro", kernels={"attention": "fast"})
    # any object with family/preset/overrides works, not only ModelSpec
    spec = SimpleNamespace(family="gpt", preset="gpt_nano", overrides={"n_layer": 1})
    assert len(models.build(spec).blocks) == 1


# --- catalog and FLOPs ------------------------------------------------------------------


def test_catalog_covers_every_preset_with_exact_counts():  # in how long: bench/cpu_bounds.py
    rows = models.catalog()
    assert [(r["family"], r["preset"]) for r in rows] == ALL_PRESETS
    by_name = {r["preset"]: r for r in rows}
    assert by_name["vit_b16"]["params"] == 86_567_656
    assert by_name["resnet50"]["params"] == 25_557_032
    assert by_name["gpt2_small"]["params"] == 124_439_808 + 47 * 768  # padded vocabulary rows
    assert by_name["vit_b16"]["input"] == "3x224x224, 1000 classes"
    assert by_name["gpt2_small"]["input"] == "seq 1024, vocab 50257"
    # timm: 17.58 GMACs; FLOPs count 2 per multiply-add, attention matmuls included
    assert by_name["vit_b16"]["forward_flops"] == pytest.approx(35.2e9, rel=0.02)
    # torchvision: 4.09 GMACs
    assert by_name["resnet50"]["forward_flops"] == pytest.approx(8.18e9, rel=0.02)
    assert all(isinstance(r["forward_flops"], int) and r["forward_flops"] > 0 for r in rows)


def test_count_flops_includes_attention_on_cpu():
    # the fused CPU attention kernel is unknown to FlopCounterMode; count_flops maps it
    torch.manual_seed(0)
    model = build("gpt", "gpt_nano")
    x = torch.zeros(1, 128, dtype=torch.long)
    with torch.device("meta"):
        on_meta = models.count_flops(build("gpt", "gpt_nano"), x.to("meta"))
    c = model.config
    attention = c.n_layer * 2 * 2 * 128 * 128 * c.n_embd  # QK^T and AV, 2 FLOPs per MAC
    linear = c.n_layer * 2 * 128 * 12 * c.n_embd**2 + 2 * 128 * c.n_embd * c.vocab_size
    assert models.count_flops(model, x) == on_meta == attention + linear
