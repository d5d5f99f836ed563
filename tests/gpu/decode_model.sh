# Sourced by decode_ab.sh and decode_timeline.sh (". tests/gpu/decode_model.sh"): the model they
# decode with, GPT-2 small with random weights made by transformers (tests/gpu/generate_ref.py) and
# imported with ./train_gpt --import-hf into $D/gpt2_ck, made once; and the prompts, made each time
# from fixed seeds: $D/prompts1.txt (one of 16 tokens), $D/prompts8.txt (eight of 5 to 12 tokens).
D=build/prof_decode
mkdir -p $D
if [ ! -f $D/gpt2_ck/latest_checkpointed_iteration.txt ]; then
  python3 tests/gpu/generate_ref.py make-gpt2 $D/gpt2 > /dev/null 2>&1 && ./train_gpt --import-hf $D/gpt2 --save $D/gpt2_ck > /dev/null \
    || { echo "$0: could not make the model (python3 with transformers, ./train_gpt)"; exit 1; }
fi
python3 -c "
import numpy as np
ids = np.random.default_rng(5).integers(0, 50000, (1, 16))
open('$D/prompts1.txt', 'w').write(''.join(' '.join(map(str, r)) + '\n' for r in ids))
ids = np.random.default_rng(6).integers(0, 50000, (8, 16))
open('$D/prompts8.txt', 'w').write(''.join(' '.join(map(str, r[:5 + i])) + '\n' for i, r in enumerate(ids)))"
