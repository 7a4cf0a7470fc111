"""The tutorial's flow on a small BERT built from a config (transformers, no downloads), on 2
gloo ranks: init_compression -> train with the engine -> redundancy_clean -> save -> load into
a plain model of the smaller shape. 8-bit weights + 50% sparse pruning (+ 50% FFN rows) must
stay within 2 accuracy points of the same model trained uncompressed."""
import torch

SEQ, VOCAB, STEPS = 8, 50, 120


def _data(count, seed):
    """Label: whether the first token after [CLS] lies in the lower half of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (count, SEQ), generator=g)
    ids[:, 0] = 0
    return ids, (ids[:, 1] < VOCAB // 2).long()


def _bert(intermediate=64):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=intermediate,
                        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    config._attn_implementation = "eager"
    return BertForSequenceClassification(config)


COMPRESSION = {"compression_training": {
    "weight_quantization": {
        "shared_parameters": {"enabled": True, "quantize_weight_in_forward": True,
                              "quantize_groups": 4, "schedule_offset": 0},
        "different_groups": {"wq1": {"params": {"start_bits": 8, "target_bits": 8},
                                     "modules": ["attention", "intermediate", "output.dense"]}}},
    "sparse_pruning": {
        "shared_parameters": {"enabled": True, "method": "l1", "schedule_offset": 40},
        "different_groups": {"sp1": {"params": {"dense_ratio": 0.5},
                                     "modules": ["attention.self", "attention.output"]}}},
    "row_pruning": {
        "shared_parameters": {"enabled": True, "method": "l1", "schedule_offset": 40},
        "different_groups": {"rp1": {"params": {"dense_ratio": 0.5},
                                     "modules": ["intermediate.dense"],
                                     "related_modules": [["layer.\\w+.output.dense"]]}}}}}


def _accuracy(model, ids, labels):
    model.eval()
    with torch.no_grad():
        return (model(input_ids=ids).logits.argmax(-1) == labels).float().mean().item()


def _train(model, config):
    import deepspeed
    from deepspeed import comm as dist

    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    ids, labels = _data(STEPS * 16, seed=1)
    rank = dist.get_rank()
    for step in range(STEPS):
        rows = slice(step * 16 + rank * 8, step * 16 + rank * 8 + 8)
        loss = engine(input_ids=ids[rows], labels=labels[rows]).loss
        engine.backward(loss)
        engine.step()
    engine.destroy()
    return model


def _flow(save_dir):
    from deepspeed import comm as dist
    from deepspeed.compression.compress import init_compression, redundancy_clean

    config = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
              **COMPRESSION}
    test_ids, test_labels = _data(512, seed=2)
    dense = _train(_bert(), {k: v for k, v in config.items() if k != "compression_training"})
    dense_acc = _accuracy(dense, test_ids, test_labels)

    model = init_compression(_bert(), config)
    _train(model, config)
    masked_logits = model.eval()(input_ids=test_ids).logits.detach()
    redundancy_clean(model, config)
    cleaned_logits = model(input_ids=test_ids).logits.detach()
    path = f"{save_dir}/compressed.pt"
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()
    plain = _bert(intermediate=32)
    plain.load_state_dict(torch.load(path, weights_only=True))
    plain_logits = plain.eval()(input_ids=test_ids).logits.detach()
    layer = plain.bert.encoder.layer[0]
    zeros = (layer.attention.self.query.weight == 0).float().mean().item()
    distinct = layer.attention.self.query.weight.detach().reshape(4, -1)
    return dict(dense_acc=dense_acc, compressed_acc=_accuracy(plain, test_ids, test_labels),
                clean_err=(cleaned_logits - masked_logits).abs().max().item(),
                load_err=(plain_logits - cleaned_logits).abs().max().item(),
                sparsity=zeros, max_levels=max(r.unique().numel() for r in distinct))


def test_tutorial_flow_on_small_bert(dist_pool, tmp_path):
    for result in dist_pool.run(_flow, args=(str(tmp_path),), timeout=240):
        assert result["dense_acc"] > 0.9, result
        assert result["compressed_acc"] >= result["dense_acc"] - 0.02, result
        assert result["clean_err"] < 1e-4 and result["load_err"] < 1e-5, result
        assert 0.49 <= result["sparsity"] <= 0.52, result  # 50% pruned (+ exact zeros)
        assert result["max_levels"] <= 256, result
