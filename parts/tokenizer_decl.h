/* parts/tokenizer_decl.h: placeholder */
