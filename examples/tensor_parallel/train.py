"""AutoTP training of a tiny Llama (built from a config, no downloads) on CPU ranks.

    deepspeed --num_gpus 2 examples/tensor_parallel/train.py --tp 2 --steps 20
    deepspeed --num_gpus 4 examples/tensor_parallel/train.py --tp 2 --zero 1   # TP 2 x DP 2

``deepspeed.tp_model_init`` splits every decoder layer over ``--tp`` ranks (AutoTP), then
``deepspeed.initialize`` trains it with the ``tensor_parallel`` section; the ranks of one
tensor-parallel group read the same batch, the data-parallel replicas different ones. At the
end ``save_16bit_model`` gathers the shards into one unsplit state dict, which a plain
single-process model loads.
"""
import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import require  # noqa: E402

require("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import deepspeed  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2))
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()

    deepspeed.init_distributed()
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    torch.manual_seed(0)
    model = deepspeed.tp_model_init(LlamaForCausalLM(config), tp_size=args.tp,
                                    dtype=torch.float32)
    ds_config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
                 "zero_optimization": {"stage": args.zero},
                 "tensor_parallel": {"autotp_size": args.tp}, "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, config=ds_config,
                                      model_parameters=model.parameters())
    mpu = engine.mpu
    rank = torch.distributed.get_rank()
    if rank == 0:
        print(f"tensor parallel {mpu.get_tensor_model_parallel_world_size()} x data parallel "
              f"{mpu.get_data_parallel_world_size()}; q_proj on this rank: "
              f"{tuple(engine.module.model.layers[0].self_attn.q_proj.weight.shape)}")
    # a toy dataset of 4 batches it can memorise; every data-parallel rank its own batches
    gen = torch.Generator().manual_seed(100 + mpu.get_data_parallel_rank())
    batches = [torch.randint(0, 128, (4, 32), generator=gen) for _ in range(4)]
    first = last = None
    for step in range(args.steps):
        ids = batches[step % len(batches)]
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        first = loss.item() if first is None else first
        last = loss.item()
    if rank == 0:
        print(f"steps: {args.steps} loss: {first:.3f} -> {last:.3f}")
    out = os.path.join(tempfile.gettempdir(), "autotp_example")
    engine.save_16bit_model(out, "model.bin")
    if rank == 0:
        full = LlamaForCausalLM(config)
        full.load_state_dict(torch.load(os.path.join(out, "model.bin"), weights_only=True))
        print(f"saved the gathered model: q_proj {tuple(full.model.layers[0].self_attn.q_proj.weight.shape)}")
    engine.destroy()


if __name__ == "__main__":
    main()
