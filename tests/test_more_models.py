"""Hugging Face model families beyond test_models.py's fourteen, each built from a tiny config
with random weights (no hub download): on "tpu", with the CPU fallback off, a forward in eval
mode gives every output tensor CPU gives (float32, 1e-4), and causal LMs greedily generate
CPU's 8 tokens (up to a near tie, which rounding may break either way). Families are listed by
the aten ops they bring (weight norm, depthwise and transposed convs, pixel shuffle, FFT,
state-space scans, MoE routing, mRoPE, ...)."""
import copy

import pytest
import torch
from helpers import TPU, assert_same_greedy, greedy

transformers = pytest.importorskip("transformers")

# Shrinks a config: keys it lacks are ignored.
SMALL = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, n_routed_experts=4, num_local_experts=4, num_experts=4,
    num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
    sliding_window=16, n_embd=64, n_layer=2, n_head=4, n_inner=128, n_positions=128, n_ctx=128, d_model=64,
    d_ff=128, d_kv=16, num_layers=2, num_heads=4, num_decoder_layers=2, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, ffn_dim=128,
    word_embed_proj_dim=64, rotary_dim=8, partial_rotary_factor=0.5, embedding_size=64, dim=64, hidden_dim=128,
    n_heads=4, n_layers=2, projection_dim=32, max_window_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    global_attn_every_n_layers=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
    v_head_dim=16, layer_types=None, attn_implementation="sdpa",
    # Dropout draws differ between devices.
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, dropout=0.0, attention_dropout=0.0, hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0, activation_dropout=0.0, dropout_rate=0.0,
)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _ids(shape=(2, 10), seed=4, high=128):
    return torch.randint(3, high, shape, generator=_gen(seed))


def _pixels(size=32, seed=4):
    return torch.randn(2, 3, size, size, generator=_gen(seed))


def _lm():
    return dict(input_ids=_ids((2, 12), 1))


def _masked():
    return dict(input_ids=_ids(), attention_mask=torch.tensor([[1] * 10, [1] * 7 + [0] * 3]))


def _s2s():
    return dict(input_ids=_ids(), decoder_input_ids=_ids((2, 5), 6))


def _px():
    return dict(pixel_values=_pixels())


def _px64():
    return dict(pixel_values=_pixels(64))


def _wave():
    return dict(input_values=torch.randn(2, 1600, generator=_gen(4)))


def _with_image(n_tokens, prefix=(), **extra):
    """Prompt ids starting with `n_tokens` image tokens (id 120), plus the image inputs."""
    def inputs():
        text = _ids((2, 8), 4, high=100)
        image = torch.tensor([list(prefix) + [120] * n_tokens] * 2, dtype=torch.long)
        x = dict(input_ids=torch.cat([image, text], 1))
        x.update({k: v() for k, v in extra.items()})
        return x
    return inputs


def _qwen_vl():
    # Two 16x16 images of 4x4 patches (96 values each), merged 2x2 into 4 tokens each.
    x = _with_image(4, prefix=(121,), pixel_values=lambda: torch.randn(32, 96, generator=_gen(4)),
                    image_grid_thw=lambda: torch.tensor([[1, 4, 4], [1, 4, 4]]))()
    x["mm_token_type_ids"] = (x["input_ids"] == 120).long()
    return x


def _series():
    g = _gen(4)
    return dict(past_values=torch.randn(2, 11, generator=g), past_time_features=torch.randn(2, 11, 1, generator=g),
                past_observed_mask=torch.ones(2, 11), future_values=torch.randn(2, 4, generator=g),
                future_time_features=torch.randn(2, 4, 1, generator=g))


def _text_image():
    return dict(input_ids=_ids((2, 7), 4), pixel_values=_pixels())


def _video():
    return dict(pixel_values=torch.randn(2, 4, 3, 32, 32, generator=_gen(4)))


def _jitter(scale):
    """Zero- or constant-initialized routers, score heads and codebooks make exact ties, whose
    order PyTorch leaves unspecified (top-k on CPU follows std::nth_element): noise on every
    parameter and codebook."""
    def post(model):
        g = _gen(7)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * scale)
            for n, b in model.named_buffers():
                if n.endswith("embed_sum"):
                    b.copy_(torch.randn(b.shape, generator=g))
    return post


LLAMA = dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128, pad_token_id=0,
             bos_token_id=1, eos_token_id=2)
VIT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
           patch_size=8)
TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, projection_dim=32)
DUAL = dict(text_config=TEXT, vision_config=dict(VIT, projection_dim=32))
RESNET = dict(model_type="resnet", embedding_size=16, hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1])
DETR = dict(small=False, use_timm_backbone=False, use_pretrained_backbone=False, d_model=32, encoder_layers=1,
            decoder_layers=1, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
            decoder_attention_heads=4, num_queries=10)
CONV_AUDIO = dict(conv_dim=(32, 32, 32), conv_stride=(5, 4, 2), conv_kernel=(10, 4, 2), num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=4, num_feat_extract_layers=3, mask_time_prob=0.0, vocab_size=32)
TS = dict(ctor=True, prediction_length=4, context_length=8, lags_sequence=[1, 2, 3], num_time_features=1, d_model=32,
          encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_attention_heads=2,
          decoder_attention_heads=2)
LINEAR_ATTN = dict(layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
MLA = dict(num_key_value_heads=4, head_dim=8)  # every head has its keys; head_dim is the rotary part

CLM, MLM, S2S, IMG, CTC = ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM",
                           "AutoModelForImageClassification", "AutoModelForCTC")

# Families whose default config only needs SMALL. FalconH1 passes too, but takes 12 s (half of
# it CPU's pure-PyTorch Mamba scan), so it is left out for time.
PLAIN_CAUSAL = [
    "Phi3", "Phi", "Falcon", "OPT", "GPTNeoX", "GPTJ", "Bloom", "StableLm", "Starcoder2", "Cohere", "Cohere2", "Olmo",
    "Olmo2", "Olmo3", "Granite", "GraniteMoe", "GraniteMoeShared", "Qwen2Moe", "Qwen3Moe", "Phimoe", "GPTBigCode",
    "CodeGen", "GPTNeo", "Glm", "Glm4", "Glm4Moe", "Helium", "Olmoe", "SmolLM3", "Exaone", "Exaone4", "Ernie4_5",
    "Ernie4_5_Moe", "Apertus", "Arcee", "Dots1", "Mpt", "XGLM", "BioGpt", "Persimmon", "Nemotron", "GptOss",
    "HunYuanDenseV1", "HunYuanMoEV1", "Ministral", "SeedOss", "Llama4Text", "Mamba", "FalconMamba", "DiffLlama",
    "JetMoe", "Lfm2", "BitNet", "CTRL", "OpenAIGPT", "ModernBertDecoder", "VaultGemma", "InternLM3", "MiniMax",
    "NanoChat", "Cwm", "Jais2", "Mellum", "SolarOpen", "Laguna",
]
PLAIN_MASKED = [
    "Roberta", "DistilBert", "DebertaV2", "Deberta", "Electra", "Albert", "XLMRoberta", "ModernBert", "MPNet",
    "Camembert", "ConvBert", "Ernie", "RoFormer", "MegatronBert", "SqueezeBert", "Funnel",
    "Data2VecText", "RobertaPreLayerNorm", "XLMRobertaXL", "RemBert", "Nystromformer", "Yoso", "FNet", "Longformer",
    "BigBird", "EuroBert", "NomicBert", "Esm", "IBert", "LayoutLM", "Mra", "Flaubert", "XLM", "Tapas",
    "JinaEmbeddingsV3", "Ultrabert",
]
SEQ2SEQ = [
    "Bart", "MBart", "Pegasus", "Marian", "Blenderbot", "BlenderbotSmall", "M2M100", "MT5", "UMT5", "LongT5", "PLBart",
    "LED", "BigBirdPegasus", "PegasusX", "ProphetNet", "FSMT", "Mvp", "NllbMoe", "SwitchTransformers",
]
VIT_CLASSIFIERS = ["Dinov2", "Dinov2WithRegisters", "Beit", "Data2VecVision", "ViTMSN", "IJepa"]

# name: (config class prefix, model class, inputs, options). Options: causal (also compare greedy
# generation), small=False (skip SMALL), ctor (pass the overrides to the config's constructor,
# for configs that derive sizes there), post (a function of the built model); the rest are config
# overrides (dict values are sub-configs, always passed to the constructor).
FAMILIES = {
    **{n: (n, CLM, _lm, dict(causal=True)) for n in PLAIN_CAUSAL},
    "DeepseekV2": ("DeepseekV2", CLM, _lm, dict(MLA, causal=True)),
    "MiniCPM3": ("MiniCPM3", CLM, _lm, dict(MLA, causal=True)),
    "Youtu": ("Youtu", CLM, _lm, dict(MLA, causal=True)),
    "LongcatFlash": ("LongcatFlash", CLM, _lm, dict(MLA, causal=True, ctor=True, qk_head_dim=16, ffn_hidden_size=128,
                                                    expert_ffn_hidden_size=32, moe_topk=2, num_layers=1,
                                                    zero_expert_num=1)),
    "Dbrx": ("Dbrx", CLM, _lm, dict(causal=True, ctor=True, d_model=64, n_heads=4, n_layers=2, vocab_size=128,
                                    max_seq_len=128, ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2),
                                    attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0))),
    "Afmoe": ("Afmoe", CLM, _lm, dict(causal=True, post=_jitter(0.05))),  # zero-initialized router
    "Mamba2": ("Mamba2", CLM, _lm, dict(causal=True, num_heads=4, head_dim=32, n_groups=1, chunk_size=8,
                                        state_size=16, time_step_rank=8)),
    "Jamba": ("Jamba", CLM, _lm, dict(causal=True, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                                      expert_layer_offset=1, mamba_dt_rank=8, use_mamba_kernels=False)),
    "Bamba": ("Bamba", CLM, _lm, dict(causal=True, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32,
                                      mamba_d_state=16, mamba_chunk_size=8)),
    "Zamba2": ("Zamba2", CLM, _lm, dict(causal=True, layers_block_type=["linear_attention", "hybrid"],
                                        hybrid_layer_ids=[1], mamba_d_state=16, n_mamba_heads=4, mamba_headdim=32,
                                        use_mamba_kernels=False, num_mem_blocks=1, chunk_size=8,
                                        attention_hidden_size=128, head_dim=32, attention_head_dim=32,
                                        adapter_rank=8)),
    "Qwen3Next": ("Qwen3Next", CLM, _lm, dict(LINEAR_ATTN, causal=True)),
    "Qwen3_5Text": ("Qwen3_5Text", CLM, _lm, dict(LINEAR_ATTN, causal=True)),
    "Lfm2Moe": ("Lfm2Moe", CLM, _lm, dict(causal=True, layer_types=["conv", "full_attention"], num_dense_layers=1)),
    "RecurrentGemma": ("RecurrentGemma", CLM, _lm, dict(causal=True, block_types=["recurrent", "attention"],
                                                        lru_width=64, attention_window_size=16)),
    "xLSTM": ("xLSTM", CLM, _lm, dict(causal=True, embedding_dim=64, num_blocks=2, qk_dim_factor=1.0, v_dim_factor=1.0,
                                      mode="inference", chunk_size=4, chunkwise_kernel="chunkwise--native_autograd",
                                      sequence_kernel="native_sequence__native", step_kernel="native")),
    "Rwkv": ("Rwkv", CLM, _lm, dict(causal=True, attention_hidden_size=64, intermediate_size=256,
                                    context_length=64)),
    "Gemma3nText": ("Gemma3nText", CLM, _lm, dict(causal=True, intermediate_size=[128, 128],
                                                  layer_types=["sliding_attention", "full_attention"],
                                                  num_kv_shared_layers=0, activation_sparsity_pattern=[0.0, 0.0],
                                                  hidden_size_per_layer_input=16, vocab_size_per_layer_input=128,
                                                  laurel_rank=8, altup_num_inputs=2)),
    "Git": ("Git", "GitForCausalLM", lambda: dict(input_ids=_ids((2, 8), 4), pixel_values=_pixels()),
            dict(vision_config=VIT)),
    # Encoders.
    **{n: (n, MLM, _masked, {}) for n in PLAIN_MASKED},
    "XLNet": ("XLNet", "XLNetLMHeadModel", lambda: dict(input_ids=_ids()), dict(d_inner=128, d_head=16)),
    "Xmod": ("Xmod", MLM, _masked, dict(post=lambda m: m.set_default_language("en_XX"))),
    # Its LM head adds hidden_size - embedding_size columns: keep them non-empty.
    "MobileBert": ("MobileBert", MLM, _masked, dict(embedding_size=32)),
    "Luke": ("Luke", MLM, _masked, dict(entity_vocab_size=64, entity_emb_size=32)),
    "MarkupLM": ("MarkupLM", "AutoModel", _masked, {}),
    "Canine": ("Canine", "AutoModel", _masked, dict(local_transformer_stride=8, num_hash_buckets=64,
                                                    num_hash_functions=4)),
    "Lilt": ("Lilt", "AutoModel", lambda: dict(input_ids=_ids(), bbox=torch.randint(0, 1000, (2, 10, 4),
                                                                                     generator=_gen(3)).sort(-1).values),
             dict(hidden_size=96)),
    "Bros": ("Bros", "AutoModel", lambda: dict(input_ids=_ids(), bbox=torch.rand(2, 10, 8, generator=_gen(3))),
             dict(ctor=True, hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2,
                  vocab_size=128)),
    # Encoder-decoders.
    **{n: (n, S2S, _s2s, dict(decoder_start_token_id=1, forced_eos_token_id=None)) for n in SEQ2SEQ},
    "T5Gemma": ("T5Gemma", S2S, _s2s, dict(small=False, ctor=True, vocab_size=128, **{
        part: dict({k: v for k, v in LLAMA.items() if k != "model_type"}, sliding_window=16,
                   layer_types=["sliding_attention", "full_attention"])
        for part in ("encoder", "decoder")})),
    # Vision.
    **{n: (n, IMG, _px, dict(image_size=32, patch_size=8)) for n in VIT_CLASSIFIERS},
    "DeiT": ("DeiT", "DeiTForImageClassification", _px, dict(image_size=32, patch_size=8)),
    "DINOv3ViT": ("DINOv3ViT", "AutoModel", _px, dict(image_size=32, patch_size=8)),
    "ViTMAE": ("ViTMAE", "AutoModel", lambda: dict(pixel_values=_pixels(), noise=torch.rand(2, 16, generator=_gen(5))),
               dict(image_size=32, patch_size=8, mask_ratio=0.0)),
    "Yolos": ("Yolos", "YolosForObjectDetection", _px, dict(image_size=[32, 32], patch_size=8, num_detection_tokens=5)),
    **{n: (n, IMG, _px, dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4))
       for n in ["Swin", "Swinv2"]},
    **{n: (n, IMG, _px, dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)) for n in ["ConvNext", "ConvNextV2"]},
    "ResNet": ("ResNet", IMG, _px, dict(hidden_sizes=[16, 32], depths=[1, 1], embedding_size=16)),
    "RegNet": ("RegNet", IMG, _px, dict(hidden_sizes=[16, 32], depths=[1, 1], embedding_size=16, groups_width=8)),
    "BiT": ("Bit", IMG, _px, dict(hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1], embedding_size=16,
                                  num_groups=8)),
    **{n: (n, IMG, _px, dict(image_size=32, depth_multiplier=0.25)) for n in ["MobileNetV1", "MobileNetV2"]},
    "MobileViT": ("MobileViT", IMG, _px, dict(image_size=32, hidden_sizes=[16, 24, 32],
                                              neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])),
    "EfficientNet": ("EfficientNet", IMG, _px, dict(image_size=32, width_coefficient=0.25, depth_coefficient=0.25,
                                                    hidden_dim=320)),
    "Segformer": ("Segformer", IMG, _px, dict(hidden_sizes=[16, 32, 32, 64], num_attention_heads=[1, 2, 2, 4],
                                              depths=[1, 1, 1, 1])),
    "SegformerSegmentation": ("Segformer", "SegformerForSemanticSegmentation", _px,
                              dict(hidden_sizes=[16, 32, 32, 64], num_attention_heads=[1, 2, 2, 4],
                                   depths=[1, 1, 1, 1], decoder_hidden_size=32)),
    "PoolFormer": ("PoolFormer", IMG, _px, dict(hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1])),
    "Levit": ("Levit", "LevitForImageClassification", _px,
              dict(image_size=32, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4], depths=[1, 1, 1],
                   key_dim=[8, 8, 8], down_ops=[["Subsample", 8, 3, 4, 2, 2], ["Subsample", 8, 4, 4, 2, 2]])),
    "Cvt": ("Cvt", IMG, _px, dict(embed_dim=[16, 32, 64], num_heads=[1, 2, 4], depth=[1, 2, 3],
                                  drop_path_rate=[0.0] * 3)),
    "FocalNet": ("FocalNet", IMG, _px, dict(image_size=32, embed_dim=16, depths=[1, 1], hidden_sizes=[16, 32])),
    "PvtV2": ("PvtV2", IMG, _px, dict(image_size=[32, 32], hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1],
                                      num_attention_heads=[1, 2, 2, 4])),
    "Hiera": ("Hiera", IMG, _px64, dict(image_size=[64, 64], embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                                        patch_size=[3, 3], patch_padding=[1, 1], masked_unit_size=[4, 4],
                                        num_query_pool=2, mask_ratio=0.0)),
    "SwiftFormer": ("SwiftFormer", IMG, _px, dict(embed_dims=[16, 16, 32, 32], depths=[1, 1, 1, 1])),
    "Swin2SR": ("Swin2SR", "Swin2SRForImageSuperResolution", lambda: dict(pixel_values=_pixels(16)),
                dict(small=False, image_size=16, patch_size=1, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                     window_size=4, upscale=2, upsampler="pixelshuffle")),
    "UperNet": ("UperNet", "UperNetForSemanticSegmentation", _px64,
                dict(small=False, hidden_size=32, auxiliary_in_channels=32, auxiliary_channels=16,
                     backbone_config=dict(model_type="convnext", hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1],
                                          out_features=["stage1", "stage2", "stage3", "stage4"]))),
    "DPT": ("DPT", "DPTForDepthEstimation", _px, dict(image_size=32, patch_size=8, num_hidden_layers=4,
                                                      backbone_out_indices=[0, 1, 2, 3],
                                                      neck_hidden_sizes=[8, 16, 32, 64], fusion_hidden_size=32)),
    "DepthAnything": ("DepthAnything", "DepthAnythingForDepthEstimation", _px,
                      dict(small=False, patch_size=8, reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 32, 64],
                           fusion_hidden_size=16, head_hidden_size=8,
                           backbone_config=dict(model_type="dinov2", hidden_size=32, num_hidden_layers=4,
                                                num_attention_heads=2, intermediate_size=64, image_size=32,
                                                patch_size=8, out_indices=[1, 2, 3, 4], reshape_hidden_states=False))),
    "VitPose": ("VitPose", "VitPoseForPoseEstimation", lambda: dict(pixel_values=torch.randn(2, 3, 32, 24, generator=_gen(4))),
                dict(small=False, backbone_config=dict(model_type="vitpose_backbone", hidden_size=32,
                                                       num_hidden_layers=2, num_attention_heads=2,
                                                       intermediate_size=64, image_size=[32, 24], patch_size=[8, 8],
                                                       out_indices=[2]))),
    **{n: (n, f"{n}ForVideoClassification", _video, dict(image_size=32, num_frames=4, **extra))
       for n, extra in [("VideoMAE", dict(patch_size=8, tubelet_size=2)), ("Vivit", dict(tubelet_size=[2, 8, 8])),
                        ("Timesformer", dict(patch_size=8))]},
    # Detection and segmentation heads over ResNet backbones (deformable attention: grid_sample).
    "Detr": ("Detr", "DetrForObjectDetection", _px64, dict(DETR, backbone_config=dict(RESNET, out_features=["stage4"]))),
    "ConditionalDetr": ("ConditionalDetr", "ConditionalDetrForObjectDetection", _px64,
                        dict(DETR, backbone_config=dict(RESNET, out_features=["stage4"]))),
    "DeformableDetr": ("DeformableDetr", "DeformableDetrForObjectDetection", _px64,
                       dict(DETR, decoder_layers=2, num_feature_levels=3,
                            backbone_config=dict(RESNET, out_features=["stage2", "stage3", "stage4"]))),
    # RT-DETR's query selection is a top-k over nearly equal scores at random init: larger
    # weights spread them beyond float32 rounding. Its decoder's output then varies with the
    # host's float32 rounding: 1.6e-4 from torch CPU's on an AMD EPYC host (within 1e-4 on Intel's).
    "RTDetr": ("RTDetr", "RTDetrForObjectDetection", lambda: dict(pixel_values=_pixels(96)),
               dict(small=False, post=_jitter(0.3), tol=5e-4, encoder_in_channels=[32, 32, 64], encoder_hidden_dim=32,
                    encoder_ffn_dim=64, d_model=32, decoder_ffn_dim=64, decoder_layers=1, num_queries=5,
                    num_feature_levels=3, decoder_in_channels=[32, 32, 32], eval_size=None,
                    backbone_config=dict(RESNET, model_type="rt_detr_resnet",
                                         out_features=["stage2", "stage3", "stage4"]))),
    "Sam": ("Sam", "SamModel", lambda: dict(pixel_values=_pixels(64),
                                            input_points=torch.tensor([[[[10.0, 20.0]]], [[[30.0, 5.0]]]])),
            dict(small=False, vision_config=dict(hidden_size=32, output_channels=16, num_hidden_layers=2,
                                                 num_attention_heads=2, image_size=64, patch_size=16,
                                                 global_attn_indexes=[1], window_size=2, mlp_dim=64, num_pos_feats=8),
                 prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=16, mask_input_channels=4),
                 mask_decoder_config=dict(hidden_size=16, num_hidden_layers=2, mlp_dim=32, num_attention_heads=2,
                                          iou_head_hidden_dim=16))),
    # Dual encoders.
    **{n: (n, "AutoModel", _text_image, DUAL)
       for n in ["CLIP", "Siglip", "AltCLIP", "ChineseCLIP", "Owlv2", "OwlViT", "GroupViT", "MetaClip2", "Aimv2"]},
    "Blip": ("Blip", "BlipForImageTextRetrieval", _text_image, DUAL),
    "Siglip2": ("Siglip2", "AutoModel",
                lambda: dict(input_ids=_ids((2, 7), 4), pixel_values=torch.randn(2, 16, 192, generator=_gen(4)),
                             pixel_attention_mask=torch.ones(2, 16, dtype=torch.long),
                             spatial_shapes=torch.tensor([[4, 4], [4, 4]])),
                dict(text_config=TEXT, vision_config=dict(VIT, num_patches=16))),
    "CLIPVision": ("CLIPVision", "CLIPVisionModel", _px, VIT),
    "SiglipVision": ("SiglipVision", "SiglipVisionModel", _px, VIT),
    # Speech and audio (wav2vec2's positional conv is weight-normed: _weight_norm_interface).
    **{n: (n, CTC, _wave, dict(CONV_AUDIO, **extra)) for n, extra in [
        ("Wav2Vec2", {}), ("Hubert", {}), ("WavLM", dict(num_buckets=16, max_bucket_distance=64)),
        ("Data2VecAudio", {}), ("UniSpeech", {}), ("UniSpeechSat", {}), ("SEW", dict(squeeze_factor=2)),
        ("SEWD", dict(squeeze_factor=2)), ("Wav2Vec2Conformer", {})]},
    "Wav2Vec2Bert": ("Wav2Vec2Bert", CTC, lambda: dict(input_features=torch.randn(2, 20, 160, generator=_gen(4))),
                     dict(vocab_size=32, output_hidden_size=64, conv_depthwise_kernel_size=3,
                          feature_projection_input_dim=160)),
    "SpeechT5": ("SpeechT5", "SpeechT5ForSpeechToText",
                 lambda: dict(_wave(), decoder_input_ids=_ids((2, 5), 6)),
                 dict(CONV_AUDIO, vocab_size=128, decoder_start_token_id=1)),
    "Speech2Text": ("Speech2Text", "AutoModelForSpeechSeq2Seq",
                    lambda: dict(input_features=torch.randn(2, 32, 16, generator=_gen(4)),
                                 decoder_input_ids=_ids((2, 5), 6)),
                    dict(input_feat_per_channel=16, conv_channels=32, max_source_positions=64,
                         max_target_positions=64, decoder_start_token_id=1)),
    "Moonshine": ("Moonshine", "AutoModelForSpeechSeq2Seq",
                  lambda: dict(input_values=torch.randn(2, 4000, generator=_gen(4)), decoder_input_ids=_ids((2, 5), 6)),
                  dict(decoder_start_token_id=1)),
    "AST": ("AST", "AutoModelForAudioClassification",
            lambda: dict(input_values=torch.randn(2, 64, 16, generator=_gen(4))),
            dict(max_length=64, num_mel_bins=16, patch_size=8, frequency_stride=8, time_stride=8)),
    "Encodec": ("Encodec", "EncodecModel", lambda: dict(input_values=torch.randn(2, 1, 1600, generator=_gen(4))),
                dict(small=False, post=_jitter(0.05), hidden_size=32, num_filters=8, upsampling_ratios=[4, 2],
                     codebook_size=64, codebook_dim=32, num_lstm_layers=1, target_bandwidths=[1.5],
                     sampling_rate=800)),
    "Mimi": ("Mimi", "MimiModel", lambda: dict(input_values=torch.randn(2, 1, 1920, generator=_gen(4))),
             dict(small=False, post=_jitter(0.05), hidden_size=32, num_filters=8, upsampling_ratios=[4, 2],
                  codebook_size=64, codebook_dim=32, num_quantizers=4, num_semantic_quantizers=1,
                  num_hidden_layers=2, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                  head_dim=8, sliding_window=16, sampling_rate=240, upsample_groups=32,
                  vector_quantization_hidden_dimension=32)),
    "Dac": ("Dac", "DacModel", lambda: dict(input_values=torch.randn(2, 1, 800, generator=_gen(4))),
            dict(small=False, encoder_hidden_size=8, downsampling_ratios=[2, 2], decoder_hidden_size=16,
                 n_codebooks=2, codebook_size=32, codebook_dim=4, hidden_size=32)),
    # Multimodal generation.
    "Llava": ("Llava", "LlavaForConditionalGeneration", _with_image(16, pixel_values=_pixels),
              dict(small=False, causal=True, text_config=LLAMA, vision_config=dict(VIT, model_type="clip_vision_model"),
                   image_token_index=120, image_seq_length=16)),
    # AnyRes: a base view and one 32x32 crop give 16 + 4 rows of (4 + newline) = 36 tokens.
    **{n: (n, f"{n}ForConditionalGeneration",
           _with_image(36, pixel_values=lambda: torch.randn(2, 2, 3, 32, 32, generator=_gen(4)),
                       image_sizes=lambda: torch.tensor([[32, 32], [32, 32]])),
           dict(small=False, causal=True, text_config=dict(LLAMA, model_type=text),
                vision_config=dict(VIT, model_type=vision), image_token_index=120, image_grid_pinpoints=[[32, 32]]))
       for n, text, vision in [("LlavaNext", "llama", "clip_vision_model"),
                               ("LlavaOnevision", "qwen2", "siglip_vision_model")]},
    "PaliGemma": ("PaliGemma", "PaliGemmaForConditionalGeneration", _with_image(16, pixel_values=_pixels),
                  dict(small=False, causal=True, ctor=True, image_token_index=120, projection_dim=64, hidden_size=64,
                       text_config=dict(LLAMA, model_type="gemma", num_key_value_heads=4),
                       vision_config=dict(VIT, model_type="siglip_vision_model", projection_dim=64))),
    "Gemma3": ("Gemma3", "Gemma3ForConditionalGeneration", _with_image(4, prefix=(121,), pixel_values=_pixels),
               dict(small=False, causal=True, mm_tokens_per_image=4, image_token_index=120, boi_token_index=121,
                    eoi_token_index=122, vision_config=dict(VIT, model_type="siglip_vision_model"),
                    text_config=dict(LLAMA, model_type="gemma3_text", sliding_window=16,
                                     layer_types=["sliding_attention", "full_attention"]))),
    **{n: (n, f"{n}ForConditionalGeneration", _qwen_vl,
           dict(small=False, causal=True, image_token_id=120, vision_start_token_id=121, vision_end_token_id=122,
                vision_config=vision,
                text_config=dict(LLAMA, model_type=text, rope_parameters=dict(
                    rope_type="default", mrope_section=[2, 3, 3], rope_theta=10000.0))))
       for n, text, vision in [
           ("Qwen2VL", "qwen2_vl_text", dict(depth=2, embed_dim=32, num_heads=2, patch_size=4, spatial_merge_size=2,
                                             hidden_size=64, mlp_ratio=2)),
           ("Qwen2_5_VL", "qwen2_5_vl_text", dict(depth=2, hidden_size=32, num_heads=2, patch_size=4,
                                                  spatial_merge_size=2, out_hidden_size=64, intermediate_size=64,
                                                  window_size=8, fullatt_block_indexes=[1]))]},
    **{n: (n, f"{n}ForConditionalGeneration",
           _with_image(4, pixel_values=lambda: torch.randn(2, 1, 3, 32, 32, generator=_gen(4))),
           dict(small=False, causal=True, vision_config=VIT, text_config=LLAMA, scale_factor=2, image_token_id=120))
       for n in ["Idefics3", "SmolVLM"]},
    "Mistral3": ("Mistral3", "Mistral3ForConditionalGeneration",
                 _with_image(4, pixel_values=_pixels, image_sizes=lambda: torch.tensor([[32, 32], [32, 32]])),
                 dict(small=False, causal=True, image_token_index=120, spatial_merge_size=2, vision_feature_layer=-1,
                      vision_config=dict(VIT, model_type="pixtral", head_dim=16),
                      text_config=dict(LLAMA, model_type="mistral"))),
    "InternVL": ("InternVL", "InternVLForConditionalGeneration", _with_image(4, pixel_values=_pixels),
                 dict(small=False, causal=True, image_token_id=120, image_seq_length=4, downsample_ratio=0.5,
                      vision_feature_layer=-1, vision_config=dict(VIT, image_size=[32, 32], patch_size=[8, 8]),
                      text_config=dict(LLAMA, model_type="qwen2"))),
    "Blip2": ("Blip2", "Blip2ForConditionalGeneration", _with_image(4, pixel_values=_pixels),
              dict(small=False, causal=True, vision_config=VIT, num_query_tokens=4, image_token_index=120,
                   qformer_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=128, encoder_hidden_size=64, vocab_size=128),
                   text_config=dict(model_type="opt", vocab_size=128, hidden_size=64, ffn_dim=128,
                                    num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=64,
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2))),
    "Qwen2Audio": ("Qwen2Audio", "Qwen2AudioForConditionalGeneration",
                   _with_image(16, input_features=lambda: torch.randn(2, 16, 64, generator=_gen(4)),
                               feature_attention_mask=lambda: torch.ones(2, 64, dtype=torch.long)),
                   dict(small=False, causal=True, audio_token_index=120, text_config=dict(LLAMA, model_type="qwen2"),
                        audio_config=dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=4,
                                          encoder_ffn_dim=128, d_model=64, max_source_positions=32))),
    "Kosmos2": ("Kosmos2", "Kosmos2ForConditionalGeneration",
                lambda: dict(input_ids=_ids(), pixel_values=_pixels(),
                             image_embeds_position_mask=torch.tensor([[0] + [1] * 4 + [0] * 5] * 2)),
                dict(small=False, latent_query_num=4, vision_config=VIT,
                     text_config=dict(vocab_size=128, embed_dim=64, layers=2, ffn_dim=128, attention_heads=4,
                                      max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2))),
    # Pix2Struct reads flattened patches, each with its (row, column) first.
    "Pix2Struct": ("Pix2Struct", "Pix2StructForConditionalGeneration",
                   lambda: dict(flattened_patches=torch.cat([
                       torch.stack(torch.meshgrid(torch.arange(1, 5.0), torch.arange(1, 5.0), indexing="ij"), -1)
                       .reshape(1, 16, 2).expand(2, 16, 2), torch.randn(2, 16, 48, generator=_gen(4))], -1),
                       attention_mask=torch.ones(2, 16), decoder_input_ids=_ids((2, 5), 6)),
                   dict(small=False, text_config=dict(vocab_size=128, hidden_size=64, d_kv=16, d_ff=128, num_layers=2,
                                                      num_heads=4),
                        vision_config=dict(hidden_size=64, patch_embed_hidden_size=48, d_ff=128, d_kv=16,
                                           num_hidden_layers=2, num_attention_heads=4, seq_len=16))),
    "Clap": ("Clap", "ClapModel",
             lambda: dict(input_ids=_ids((2, 7), 4), input_features=torch.randn(2, 1, 64, 16, generator=_gen(4))),
             dict(small=False, projection_dim=32, text_config=TEXT,
                  audio_config=dict(window_size=2, num_mel_bins=16, spec_size=32, patch_size=4, patch_stride=[4, 4],
                                    hidden_size=64, projection_dim=32, depths=[1, 1], num_attention_heads=[2, 4],
                                    patch_embeds_hidden_size=32, enable_fusion=False))),
    # Musicgen's decoder: one row of codes per codebook.
    "MusicgenDecoder": ("MusicgenDecoder", "MusicgenForCausalLM", lambda: dict(input_ids=_ids((8, 6), 4, high=64)),
                        dict(small=False, vocab_size=64, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                             num_attention_heads=4, num_codebooks=4, max_position_embeddings=64, pad_token_id=0,
                             bos_token_id=1)),
    # Time series (Autoformer's auto-correlation runs through rfft/irfft).
    "PatchTST": ("PatchTST", "PatchTSTForPrediction", lambda: dict(past_values=torch.randn(2, 32, 3, generator=_gen(4))),
                 dict(num_input_channels=3, context_length=32, patch_length=8, patch_stride=8, d_model=32, ffn_dim=64,
                      prediction_length=8)),
    "TimeSeriesTransformer": ("TimeSeriesTransformer", "TimeSeriesTransformerForPrediction", _series, TS),
    "Informer": ("Informer", "InformerForPrediction", _series, dict(TS, attention_type="full", distil=False)),
    "Autoformer": ("Autoformer", "AutoformerForPrediction", _series, dict(TS, moving_average=3, label_length=4)),
}

OPTIONS = ("causal", "small", "ctor", "post", "tol")


def build(name):
    config, model_class, _, spec = FAMILIES[name]
    overrides = {k: v for k, v in spec.items() if k not in OPTIONS}
    ctor = overrides if spec.get("ctor") else {k: v for k, v in overrides.items() if isinstance(v, dict)}
    cfg = getattr(transformers, config + "Config")(**ctor)
    if spec.get("small", True):
        for k, v in SMALL.items():
            if hasattr(cfg, k) and v is not None:
                try:
                    setattr(cfg, k, v)
                except Exception:  # noqa: BLE001
                    pass  # a derived property, a field of another type (per-stage lists), ...
    for k, v in overrides.items():
        if not isinstance(v, dict):
            setattr(cfg, k, v)
    torch.manual_seed(0)
    cls = getattr(transformers, model_class)
    model = cls.from_config(cfg) if model_class.startswith("AutoModel") else cls(cfg)
    if spec.get("post"):
        spec["post"](model)
    return model.eval()


def tensors(x, prefix="out"):
    """Every tensor of a model output (caches left out), by path."""
    if isinstance(x, torch.Tensor):
        yield prefix, x
    elif hasattr(x, "items"):
        for k, v in x.items():
            if k not in ("past_key_values", "cache_params"):
                yield from tensors(v, f"{prefix}.{k}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from tensors(v, f"{prefix}[{i}]")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_cpu(name):
    model = build(name)
    x = FAMILIES[name][2]()
    # Copied before the CPU run: some modules cache tensors on first use (Mimi/Encodec codebooks).
    dev = copy.deepcopy(model).to(TPU)
    xd = {k: v.to(TPU) for k, v in x.items()}
    with torch.no_grad():
        ref = dict(tensors(model(**x)))
        got = dict(tensors(dev(**xd)))
    assert ref and got.keys() == ref.keys()
    for k, r in ref.items():
        assert got[k].device.type == "tpu", k
        tol = FAMILIES[name][3].get("tol", 1e-4)
        torch.testing.assert_close(got[k].cpu(), r, atol=tol, rtol=tol, msg=lambda m: f"{k}: {m}")
    if FAMILIES[name][3].get("causal"):
        with torch.no_grad():
            ref_gen = greedy(model, x, 8)
            gen = dev.generate(**xd, max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert_same_greedy(gen, ref_gen)
