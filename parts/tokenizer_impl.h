/* parts/tokenizer_impl.h: placeholder */
