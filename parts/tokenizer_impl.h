// ---------------------------------------------------------------------------------------------
// GPT-2 tokenizer: byte-level BPE, the way OpenAI's tiktoken runs it (its "gpt2" encoding)
//
// Three steps turn text into ids:
//   1. pre-tokenization: GPT-2's regex cuts the text into pieces (words with their leading
//      space, digit runs, punctuation runs, whitespace runs). BPE never merges across pieces.
//        'Hello world!!' -> 'Hello' ' world' '!!'
//   2. BPE on each piece's bytes: start from one token per byte, then repeatedly merge the
//      adjacent pair whose merged token has the lowest rank (= was learned earliest), until
//      no adjacent pair forms a token.   ' world' -> ' ' 'w' 'o' 'r' 'l' 'd' -> ... -> ' world'
//   3. the ids of the final tokens, from vocab.json.
// Decoding is the reverse of step 3 only: concatenate the tokens' bytes.
//
// "Byte-level" means tokens are byte strings, so every input has an encoding (one token per
// byte at worst) and decoding gives back the exact bytes. The files store a token as text: each
// byte is written as one printable character (bytes_to_unicode in OpenAI's encoder.py):
//   bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF stand for themselves (as code points U+0021.. etc.)
//   the other 68 bytes (controls, space, 0x7F..0xA0, 0xAD) become U+0100.. in byte order
// so a space is U+0120 (a G with a dot above) and "\n" is U+010A: vocab.json's "\u0120the" is " the".
//
// Megatron-LM runs its own copy of OpenAI's encoder.py (megatron/training/tokenizer/
// gpt2_tokenization.py); tiktoken is the reference here because its ids are the ones tests
// can check against (tests/tiktoken_fuzz.py). The two agree on GPT-2's files.
// ---------------------------------------------------------------------------------------------

void mt_int_list_reserve(mt_int_list *l, size_t extra) {
    if (l->len + extra <= l->cap) return;
    size_t cap = l->cap ? l->cap : 256;
    while (cap < l->len + extra) cap *= 2;
    l->data = (int32_t *)mt_realloc(l->data, cap * sizeof(int32_t), "token ids");
    l->cap = cap;
}
void mt_int_list_push(mt_int_list *l, int32_t v) {
    if (l->len == l->cap) mt_int_list_reserve(l, 1);
    l->data[l->len++] = v;
}
void mt_int_list_free(mt_int_list *l) {
    free(l->data);
    l->data = NULL;
    l->len = l->cap = 0;
}

// ---------------------------------------------------------------------------------------------
// hashing: one string hash and one integer mixer for the three hash maps below
// (vocab bytes -> id, (id, id) -> merge, word -> ids). All three use open addressing with
// linear probing in a power-of-two table kept at most half full, so a lookup is one or two
// cache lines. The string hash eats 8 bytes per multiply; most words are shorter than that.
static uint64_t mt__mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}
// *head gets the first 8 bytes (zero-padded): the vocabulary map compares that word first
static uint64_t mt__hash_bytes(const unsigned char *p, size_t n, uint64_t *head) {
    uint64_t h = 0x243f6a8885a308d3ull ^ (uint64_t)n, w = 0;
    if (n >= 8) {
        memcpy(head, p, 8);
        while (n >= 8) {
            memcpy(&w, p, 8);
            h = (h ^ w) * 0x9e3779b97f4a7c15ull;
            h ^= h >> 29;
            p += 8;
            n -= 8;
        }
        w = 0;
        for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    } else {
        for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
        *head = w;
    }
    return mt__mix64(h ^ w);
}
static size_t mt__pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p *= 2;
    return p;
}

// ---------------------------------------------------------------------------------------------
// Unicode character classes for GPT-2's pattern
// The pattern (below) asks of each character: is it a letter \p{L} (general category Lu Ll Lt
// Lm Lo), a number \p{N} (Nd Nl No), whitespace \s (the White_Space property), or other? ASCII
// answers from a 128-entry table; any other code point from the generated step table: entry k
// is (first code point << 2) | class and the class lasts until entry k+1, so the answer is one
// binary search (11 steps over ~1,560 entries). Regenerate with tools/gen_unicode_tables.py.
enum { MT__OTHER = 0, MT__LETTER = 1, MT__NUMBER = 2, MT__SPACE = 3 };

static const unsigned char mt__ascii_class[128] = {
    0,0,0,0,0,0,0,0,0,3,3,3,3,3,0,0,   // \t \n \v \f \r are White_Space; 0x1C..0x1F are not
    0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
    3,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,   // space; punctuation (the apostrophe too) is other
    2,2,2,2,2,2,2,2,2,2,0,0,0,0,0,0,   // digits
    0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,   // A..Z
    1,1,1,1,1,1,1,1,1,1,1,0,0,0,0,0,
    0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,   // a..z
    1,1,1,1,1,1,1,1,1,1,1,0,0,0,0,0,
};

// BEGIN GENERATED: tools/gen_unicode_tables.py (Unicode 15.0.0; do not edit by hand)
// 1562 steps; code points: 136104 letters, 1831 numbers, 25 spaces, the rest other.
// entry = (first code point << 2) | class; class 0 other, 1 letter (L), 2 number (N), 3 space (\s)
#define MT__UNICODE_VERSION "15.0.0"
static const uint32_t mt__unicode_steps[1562] = {
    0x0000000,0x0000027,0x0000038,0x0000083,0x0000084,0x00000c2,0x00000e8,0x0000105,0x000016c,0x0000185,0x00001ec,0x0000217,
    0x0000218,0x0000283,0x0000284,0x00002a9,0x00002ac,0x00002ca,0x00002d0,0x00002d5,0x00002d8,0x00002e6,0x00002e9,0x00002ec,
    0x00002f2,0x00002fc,0x0000301,0x000035c,0x0000361,0x00003dc,0x00003e1,0x0000b08,0x0000b19,0x0000b48,0x0000b81,0x0000b94,
    0x0000bb1,0x0000bb4,0x0000bb9,0x0000bbc,0x0000dc1,0x0000dd4,0x0000dd9,0x0000de0,0x0000de9,0x0000df8,0x0000dfd,0x0000e00,
    0x0000e19,0x0000e1c,0x0000e21,0x0000e2c,0x0000e31,0x0000e34,0x0000e39,0x0000e88,0x0000e8d,0x0000fd8,0x0000fdd,0x0001208,
    0x0001229,0x00014c0,0x00014c5,0x000155c,0x0001565,0x0001568,0x0001581,0x0001624,0x0001741,0x00017ac,0x00017bd,0x00017cc,
    0x0001881,0x000192c,0x0001982,0x00019a8,0x00019b9,0x00019c0,0x00019c5,0x0001b50,0x0001b55,0x0001b58,0x0001b95,0x0001b9c,
    0x0001bb9,0x0001bc2,0x0001be9,0x0001bf4,0x0001bfd,0x0001c00,0x0001c41,0x0001c44,0x0001c49,0x0001cc0,0x0001d35,0x0001e98,
    0x0001ec5,0x0001ec8,0x0001f02,0x0001f29,0x0001fac,0x0001fd1,0x0001fd8,0x0001fe9,0x0001fec,0x0002001,0x0002058,0x0002069,
    0x000206c,0x0002091,0x0002094,0x00020a1,0x00020a4,0x0002101,0x0002164,0x0002181,0x00021ac,0x00021c1,0x0002220,0x0002225,
    0x000223c,0x0002281,0x0002328,0x0002411,0x00024e8,0x00024f5,0x00024f8,0x0002541,0x0002544,0x0002561,0x0002588,0x000259a,
    0x00025c0,0x00025c5,0x0002604,0x0002615,0x0002634,0x000263d,0x0002644,0x000264d,0x00026a4,0x00026a9,0x00026c4,0x00026c9,
    0x00026cc,0x00026d9,0x00026e8,0x00026f5,0x00026f8,0x0002739,0x000273c,0x0002771,0x0002778,0x000277d,0x0002788,0x000279a,
    0x00027c1,0x00027c8,0x00027d2,0x00027e8,0x00027f1,0x00027f4,0x0002815,0x000282c,0x000283d,0x0002844,0x000284d,0x00028a4,
    0x00028a9,0x00028c4,0x00028c9,0x00028d0,0x00028d5,0x00028dc,0x00028e1,0x00028e8,0x0002965,0x0002974,0x0002979,0x000297c,
    0x000299a,0x00029c0,0x00029c9,0x00029d4,0x0002a15,0x0002a38,0x0002a3d,0x0002a48,0x0002a4d,0x0002aa4,0x0002aa9,0x0002ac4,
    0x0002ac9,0x0002ad0,0x0002ad5,0x0002ae8,0x0002af5,0x0002af8,0x0002b41,0x0002b44,0x0002b81,0x0002b88,0x0002b9a,0x0002bc0,
    0x0002be5,0x0002be8,0x0002c15,0x0002c34,0x0002c3d,0x0002c44,0x0002c4d,0x0002ca4,0x0002ca9,0x0002cc4,0x0002cc9,0x0002cd0,
    0x0002cd5,0x0002ce8,0x0002cf5,0x0002cf8,0x0002d71,0x0002d78,0x0002d7d,0x0002d88,0x0002d9a,0x0002dc0,0x0002dc5,0x0002dca,
    0x0002de0,0x0002e0d,0x0002e10,0x0002e15,0x0002e2c,0x0002e39,0x0002e44,0x0002e49,0x0002e58,0x0002e65,0x0002e6c,0x0002e71,
    0x0002e74,0x0002e79,0x0002e80,0x0002e8d,0x0002e94,0x0002ea1,0x0002eac,0x0002eb9,0x0002ee8,0x0002f41,0x0002f44,0x0002f9a,
    0x0002fcc,0x0003015,0x0003034,0x0003039,0x0003044,0x0003049,0x00030a4,0x00030a9,0x00030e8,0x00030f5,0x00030f8,0x0003161,
    0x000316c,0x0003175,0x0003178,0x0003181,0x0003188,0x000319a,0x00031c0,0x00031e2,0x00031fc,0x0003201,0x0003204,0x0003215,
    0x0003234,0x0003239,0x0003244,0x0003249,0x00032a4,0x00032a9,0x00032d0,0x00032d5,0x00032e8,0x00032f5,0x00032f8,0x0003375,
    0x000337c,0x0003381,0x0003388,0x000339a,0x00033c0,0x00033c5,0x00033cc,0x0003411,0x0003434,0x0003439,0x0003444,0x0003449,
    0x00034ec,0x00034f5,0x00034f8,0x0003539,0x000353c,0x0003551,0x000355c,0x0003562,0x000357d,0x0003588,0x000359a,0x00035e4,
    0x00035e9,0x0003600,0x0003615,0x000365c,0x0003669,0x00036c8,0x00036cd,0x00036f0,0x00036f5,0x00036f8,0x0003701,0x000371c,
    0x000379a,0x00037c0,0x0003805,0x00038c4,0x00038c9,0x00038d0,0x0003901,0x000391c,0x0003942,0x0003968,0x0003a05,0x0003a0c,
    0x0003a11,0x0003a14,0x0003a19,0x0003a2c,0x0003a31,0x0003a90,0x0003a95,0x0003a98,0x0003a9d,0x0003ac4,0x0003ac9,0x0003ad0,
    0x0003af5,0x0003af8,0x0003b01,0x0003b14,0x0003b19,0x0003b1c,0x0003b42,0x0003b68,0x0003b71,0x0003b80,0x0003c01,0x0003c04,
    0x0003c82,0x0003cd0,0x0003d01,0x0003d20,0x0003d25,0x0003db4,0x0003e21,0x0003e34,0x0004001,0x00040ac,0x00040fd,0x0004102,
    0x0004128,0x0004141,0x0004158,0x0004169,0x0004178,0x0004185,0x0004188,0x0004195,0x000419c,0x00041b9,0x00041c4,0x00041d5,
    0x0004208,0x0004239,0x000423c,0x0004242,0x0004268,0x0004281,0x0004318,0x000431d,0x0004320,0x0004335,0x0004338,0x0004341,
    0x00043ec,0x00043f1,0x0004924,0x0004929,0x0004938,0x0004941,0x000495c,0x0004961,0x0004964,0x0004969,0x0004978,0x0004981,
    0x0004a24,0x0004a29,0x0004a38,0x0004a41,0x0004ac4,0x0004ac9,0x0004ad8,0x0004ae1,0x0004afc,0x0004b01,0x0004b04,0x0004b09,
    0x0004b18,0x0004b21,0x0004b5c,0x0004b61,0x0004c44,0x0004c49,0x0004c58,0x0004c61,0x0004d6c,0x0004da6,0x0004df4,0x0004e01,
    0x0004e40,0x0004e81,0x0004fd8,0x0004fe1,0x0004ff8,0x0005005,0x00059b4,0x00059bd,0x0005a03,0x0005a05,0x0005a6c,0x0005a81,
    0x0005bac,0x0005bba,0x0005bc5,0x0005be4,0x0005c01,0x0005c48,0x0005c7d,0x0005cc8,0x0005d01,0x0005d48,0x0005d81,0x0005db4,
    0x0005db9,0x0005dc4,0x0005e01,0x0005ed0,0x0005f5d,0x0005f60,0x0005f71,0x0005f74,0x0005f82,0x0005fa8,0x0005fc2,0x0005fe8,
    0x0006042,0x0006068,0x0006081,0x00061e4,0x0006201,0x0006214,0x000621d,0x00062a4,0x00062a9,0x00062ac,0x00062c1,0x00063d8,
    0x0006401,0x000647c,0x000651a,0x0006541,0x00065b8,0x00065c1,0x00065d4,0x0006601,0x00066b0,0x00066c1,0x0006728,0x0006742,
    0x000676c,0x0006801,0x000685c,0x0006881,0x0006954,0x0006a02,0x0006a28,0x0006a42,0x0006a68,0x0006a9d,0x0006aa0,0x0006c15,
    0x0006cd0,0x0006d15,0x0006d34,0x0006d42,0x0006d68,0x0006e0d,0x0006e84,0x0006eb9,0x0006ec2,0x0006ee9,0x0006f98,0x0007001,
    0x0007090,0x0007102,0x0007128,0x0007135,0x0007142,0x0007169,0x00071f8,0x0007201,0x0007224,0x0007241,0x00072ec,0x00072f5,
    0x0007300,0x00073a5,0x00073b4,0x00073b9,0x00073d0,0x00073d5,0x00073dc,0x00073e9,0x00073ec,0x0007401,0x0007700,0x0007801,
    0x0007c58,0x0007c61,0x0007c78,0x0007c81,0x0007d18,0x0007d21,0x0007d38,0x0007d41,0x0007d60,0x0007d65,0x0007d68,0x0007d6d,
    0x0007d70,0x0007d75,0x0007d78,0x0007d7d,0x0007df8,0x0007e01,0x0007ed4,0x0007ed9,0x0007ef4,0x0007ef9,0x0007efc,0x0007f09,
    0x0007f14,0x0007f19,0x0007f34,0x0007f41,0x0007f50,0x0007f59,0x0007f70,0x0007f81,0x0007fb4,0x0007fc9,0x0007fd4,0x0007fd9,
    0x0007ff4,0x0008003,0x000802c,0x00080a3,0x00080a8,0x00080bf,0x00080c0,0x000817f,0x0008180,0x00081c2,0x00081c5,0x00081c8,
    0x00081d2,0x00081e8,0x00081fd,0x0008202,0x0008228,0x0008241,0x0008274,0x0008409,0x000840c,0x000841d,0x0008420,0x0008429,
    0x0008450,0x0008455,0x0008458,0x0008465,0x0008478,0x0008491,0x0008494,0x0008499,0x000849c,0x00084a1,0x00084a4,0x00084a9,
    0x00084b8,0x00084bd,0x00084e8,0x00084f1,0x0008500,0x0008515,0x0008528,0x0008539,0x000853c,0x0008542,0x000860d,0x0008616,
    0x0008628,0x0009182,0x0009270,0x00093aa,0x0009400,0x0009dda,0x0009e50,0x000b001,0x000b394,0x000b3ad,0x000b3bc,0x000b3c9,
    0x000b3d0,0x000b3f6,0x000b3f8,0x000b401,0x000b498,0x000b49d,0x000b4a0,0x000b4b5,0x000b4b8,0x000b4c1,0x000b5a0,0x000b5bd,
    0x000b5c0,0x000b601,0x000b65c,0x000b681,0x000b69c,0x000b6a1,0x000b6bc,0x000b6c1,0x000b6dc,0x000b6e1,0x000b6fc,0x000b701,
    0x000b71c,0x000b721,0x000b73c,0x000b741,0x000b75c,0x000b761,0x000b77c,0x000b8bd,0x000b8c0,0x000c003,0x000c004,0x000c015,
    0x000c01e,0x000c020,0x000c086,0x000c0a8,0x000c0c5,0x000c0d8,0x000c0e2,0x000c0ed,0x000c0f4,0x000c105,0x000c25c,0x000c275,
    0x000c280,0x000c285,0x000c3ec,0x000c3f1,0x000c400,0x000c415,0x000c4c0,0x000c4c5,0x000c63c,0x000c64a,0x000c658,0x000c681,
    0x000c700,0x000c7c1,0x000c800,0x000c882,0x000c8a8,0x000c922,0x000c940,0x000c946,0x000c980,0x000ca02,0x000ca28,0x000cac6,
    0x000cb00,0x000d001,0x0013700,0x0013801,0x0029234,0x0029341,0x00293f8,0x0029401,0x0029834,0x0029841,0x0029882,0x00298a9,
    0x00298b0,0x0029901,0x00299bc,0x00299fd,0x0029a78,0x0029a81,0x0029b9a,0x0029bc0,0x0029c5d,0x0029c80,0x0029c89,0x0029e24,
    0x0029e2d,0x0029f2c,0x0029f41,0x0029f48,0x0029f4d,0x0029f50,0x0029f55,0x0029f68,0x0029fc9,0x002a008,0x002a00d,0x002a018,
    0x002a01d,0x002a02c,0x002a031,0x002a08c,0x002a0c2,0x002a0d8,0x002a101,0x002a1d0,0x002a209,0x002a2d0,0x002a342,0x002a368,
    0x002a3c9,0x002a3e0,0x002a3ed,0x002a3f0,0x002a3f5,0x002a3fc,0x002a402,0x002a429,0x002a498,0x002a4c1,0x002a51c,0x002a581,
    0x002a5f4,0x002a611,0x002a6cc,0x002a73d,0x002a742,0x002a768,0x002a781,0x002a794,0x002a799,0x002a7c2,0x002a7e9,0x002a7fc,
    0x002a801,0x002a8a4,0x002a901,0x002a90c,0x002a911,0x002a930,0x002a942,0x002a968,0x002a981,0x002a9dc,0x002a9e9,0x002a9ec,
    0x002a9f9,0x002aac0,0x002aac5,0x002aac8,0x002aad5,0x002aadc,0x002aae5,0x002aaf8,0x002ab01,0x002ab04,0x002ab09,0x002ab0c,
    0x002ab6d,0x002ab78,0x002ab81,0x002abac,0x002abc9,0x002abd4,0x002ac05,0x002ac1c,0x002ac25,0x002ac3c,0x002ac45,0x002ac5c,
    0x002ac81,0x002ac9c,0x002aca1,0x002acbc,0x002acc1,0x002ad6c,0x002ad71,0x002ada8,0x002adc1,0x002af8c,0x002afc2,0x002afe8,
    0x002b001,0x0035e90,0x0035ec1,0x0035f1c,0x0035f2d,0x0035ff0,0x003e401,0x003e9b8,0x003e9c1,0x003eb68,0x003ec01,0x003ec1c,
    0x003ec4d,0x003ec60,0x003ec75,0x003ec78,0x003ec7d,0x003eca4,0x003eca9,0x003ecdc,0x003ece1,0x003ecf4,0x003ecf9,0x003ecfc,
    0x003ed01,0x003ed08,0x003ed0d,0x003ed14,0x003ed19,0x003eec8,0x003ef4d,0x003f4f8,0x003f541,0x003f640,0x003f649,0x003f720,
    0x003f7c1,0x003f7f0,0x003f9c1,0x003f9d4,0x003f9d9,0x003fbf4,0x003fc42,0x003fc68,0x003fc85,0x003fcec,0x003fd05,0x003fd6c,
    0x003fd99,0x003fefc,0x003ff09,0x003ff20,0x003ff29,0x003ff40,0x003ff49,0x003ff60,0x003ff69,0x003ff74,0x0040001,0x0040030,
    0x0040035,0x004009c,0x00400a1,0x00400ec,0x00400f1,0x00400f8,0x00400fd,0x0040138,0x0040141,0x0040178,0x0040201,0x00403ec,
    0x004041e,0x00404d0,0x0040502,0x00405e4,0x004062a,0x0040630,0x0040a01,0x0040a74,0x0040a81,0x0040b44,0x0040b86,0x0040bf0,
    0x0040c01,0x0040c82,0x0040c90,0x0040cb5,0x0040d06,0x0040d09,0x0040d2a,0x0040d2c,0x0040d41,0x0040dd8,0x0040e01,0x0040e78,
    0x0040e81,0x0040f10,0x0040f21,0x0040f40,0x0040f46,0x0040f58,0x0041001,0x0041278,0x0041282,0x00412a8,0x00412c1,0x0041350,
    0x0041361,0x00413f0,0x0041401,0x00414a0,0x00414c1,0x0041590,0x00415c1,0x00415ec,0x00415f1,0x004162c,0x0041631,0x004164c,
    0x0041651,0x0041658,0x004165d,0x0041688,0x004168d,0x00416c8,0x00416cd,0x00416e8,0x00416ed,0x00416f4,0x0041801,0x0041cdc,
    0x0041d01,0x0041d58,0x0041d81,0x0041da0,0x0041e01,0x0041e18,0x0041e1d,0x0041ec4,0x0041ec9,0x0041eec,0x0042001,0x0042018,
    0x0042021,0x0042024,0x0042029,0x00420d8,0x00420dd,0x00420e4,0x00420f1,0x00420f4,0x00420fd,0x0042158,0x0042162,0x0042181,
    0x00421dc,0x00421e6,0x0042201,0x004227c,0x004229e,0x00422c0,0x0042381,0x00423cc,0x00423d1,0x00423d8,0x00423ee,0x0042401,
    0x004245a,0x0042470,0x0042481,0x00424e8,0x0042601,0x00426e0,0x00426f2,0x00426f9,0x0042702,0x0042740,0x004274a,0x0042801,
    0x0042804,0x0042841,0x0042850,0x0042855,0x0042860,0x0042865,0x00428d8,0x0042902,0x0042924,0x0042981,0x00429f6,0x00429fc,
    0x0042a01,0x0042a76,0x0042a80,0x0042b01,0x0042b20,0x0042b25,0x0042b94,0x0042bae,0x0042bc0,0x0042c01,0x0042cd8,0x0042d01,
    0x0042d58,0x0042d62,0x0042d81,0x0042dcc,0x0042de2,0x0042e01,0x0042e48,0x0042ea6,0x0042ec0,0x0043001,0x0043124,0x0043201,
    0x00432cc,0x0043301,0x00433cc,0x00433ea,0x0043401,0x0043490,0x00434c2,0x00434e8,0x0043982,0x00439fc,0x0043a01,0x0043aa8,
    0x0043ac1,0x0043ac8,0x0043c01,0x0043c76,0x0043c9d,0x0043ca0,0x0043cc1,0x0043d18,0x0043d46,0x0043d54,0x0043dc1,0x0043e08,
    0x0043ec1,0x0043f16,0x0043f30,0x0043f81,0x0043fdc,0x004400d,0x00440e0,0x004414a,0x00441c0,0x00441c5,0x00441cc,0x00441d5,
    0x00441d8,0x004420d,0x00442c0,0x0044341,0x00443a4,0x00443c2,0x00443e8,0x004440d,0x004449c,0x00444da,0x0044500,0x0044511,
    0x0044514,0x004451d,0x0044520,0x0044541,0x00445cc,0x00445d9,0x00445dc,0x004460d,0x00446cc,0x0044705,0x0044714,0x0044742,
    0x0044769,0x004476c,0x0044771,0x0044774,0x0044786,0x00447d4,0x0044801,0x0044848,0x004484d,0x00448b0,0x00448fd,0x0044904,
    0x0044a01,0x0044a1c,0x0044a21,0x0044a24,0x0044a29,0x0044a38,0x0044a3d,0x0044a78,0x0044a7d,0x0044aa4,0x0044ac1,0x0044b7c,
    0x0044bc2,0x0044be8,0x0044c15,0x0044c34,0x0044c3d,0x0044c44,0x0044c4d,0x0044ca4,0x0044ca9,0x0044cc4,0x0044cc9,0x0044cd0,
    0x0044cd5,0x0044ce8,0x0044cf5,0x0044cf8,0x0044d41,0x0044d44,0x0044d75,0x0044d88,0x0045001,0x00450d4,0x004511d,0x004512c,
    0x0045142,0x0045168,0x004517d,0x0045188,0x0045201,0x00452c0,0x0045311,0x0045318,0x004531d,0x0045320,0x0045342,0x0045368,
    0x0045601,0x00456bc,0x0045761,0x0045770,0x0045801,0x00458c0,0x0045911,0x0045914,0x0045942,0x0045968,0x0045a01,0x0045aac,
    0x0045ae1,0x0045ae4,0x0045b02,0x0045b28,0x0045c01,0x0045c6c,0x0045cc2,0x0045cf0,0x0045d01,0x0045d1c,0x0046001,0x00460b0,
    0x0046281,0x0046382,0x00463cc,0x00463fd,0x004641c,0x0046425,0x0046428,0x0046431,0x0046450,0x0046455,0x004645c,0x0046461,
    0x00464c0,0x00464fd,0x0046500,0x0046505,0x0046508,0x0046542,0x0046568,0x0046681,0x00466a0,0x00466a9,0x0046744,0x0046785,
    0x0046788,0x004678d,0x0046790,0x0046801,0x0046804,0x004682d,0x00468cc,0x00468e9,0x00468ec,0x0046941,0x0046944,0x0046971,
    0x0046a28,0x0046a75,0x0046a78,0x0046ac1,0x0046be4,0x0047001,0x0047024,0x0047029,0x00470bc,0x0047101,0x0047104,0x0047142,
    0x00471b4,0x00471c9,0x0047240,0x0047401,0x004741c,0x0047421,0x0047428,0x004742d,0x00474c4,0x0047519,0x004751c,0x0047542,
    0x0047568,0x0047581,0x0047598,0x004759d,0x00475a4,0x00475a9,0x0047628,0x0047661,0x0047664,0x0047682,0x00476a8,0x0047b81,
    0x0047bcc,0x0047c09,0x0047c0c,0x0047c11,0x0047c44,0x0047c49,0x0047cd0,0x0047d42,0x0047d68,0x0047ec1,0x0047ec4,0x0047f02,
    0x0047f54,0x0048001,0x0048e68,0x0049002,0x00491bc,0x0049201,0x0049510,0x004be41,0x004bfc4,0x004c001,0x004d0c0,0x004d105,
    0x004d11c,0x0051001,0x005191c,0x005a001,0x005a8e4,0x005a901,0x005a97c,0x005a982,0x005a9a8,0x005a9c1,0x005aafc,0x005ab02,
    0x005ab28,0x005ab41,0x005abb8,0x005ac01,0x005acc0,0x005ad01,0x005ad10,0x005ad42,0x005ad68,0x005ad6e,0x005ad88,0x005ad8d,
    0x005ade0,0x005adf5,0x005ae40,0x005b901,0x005ba02,0x005ba5c,0x005bc01,0x005bd2c,0x005bd41,0x005bd44,0x005be4d,0x005be80,
    0x005bf81,0x005bf88,0x005bf8d,0x005bf90,0x005c001,0x0061fe0,0x0062001,0x0063358,0x0063401,0x0063424,0x006bfc1,0x006bfd0,
    0x006bfd5,0x006bff0,0x006bff5,0x006bffc,0x006c001,0x006c48c,0x006c4c9,0x006c4cc,0x006c541,0x006c54c,0x006c555,0x006c558,
    0x006c591,0x006c5a0,0x006c5c1,0x006cbf0,0x006f001,0x006f1ac,0x006f1c1,0x006f1f4,0x006f201,0x006f224,0x006f241,0x006f268,
    0x0074b02,0x0074b50,0x0074b82,0x0074bd0,0x0074d82,0x0074de4,0x0075001,0x0075154,0x0075159,0x0075274,0x0075279,0x0075280,
    0x0075289,0x007528c,0x0075295,0x007529c,0x00752a5,0x00752b4,0x00752b9,0x00752e8,0x00752ed,0x00752f0,0x00752f5,0x0075310,
    0x0075315,0x0075418,0x007541d,0x007542c,0x0075435,0x0075454,0x0075459,0x0075474,0x0075479,0x00754e8,0x00754ed,0x00754fc,
    0x0075501,0x0075514,0x0075519,0x007551c,0x0075529,0x0075544,0x0075549,0x0075a98,0x0075aa1,0x0075b04,0x0075b09,0x0075b6c,
    0x0075b71,0x0075bec,0x0075bf1,0x0075c54,0x0075c59,0x0075cd4,0x0075cd9,0x0075d3c,0x0075d41,0x0075dbc,0x0075dc1,0x0075e24,
    0x0075e29,0x0075ea4,0x0075ea9,0x0075f0c,0x0075f11,0x0075f30,0x0075f3a,0x0076000,0x0077c01,0x0077c7c,0x0077c95,0x0077cac,
    0x00780c1,0x00781b8,0x0078401,0x00784b4,0x00784dd,0x00784f8,0x0078502,0x0078528,0x0078539,0x007853c,0x0078a41,0x0078ab8,
    0x0078b01,0x0078bb0,0x0078bc2,0x0078be8,0x0079341,0x00793b0,0x00793c2,0x00793e8,0x0079f81,0x0079f9c,0x0079fa1,0x0079fb0,
    0x0079fb5,0x0079fbc,0x0079fc1,0x0079ffc,0x007a001,0x007a314,0x007a31e,0x007a340,0x007a401,0x007a510,0x007a52d,0x007a530,
    0x007a542,0x007a568,0x007b1c6,0x007b2b0,0x007b2b6,0x007b2c0,0x007b2c6,0x007b2d4,0x007b406,0x007b4b8,0x007b4be,0x007b4f8,
    0x007b801,0x007b810,0x007b815,0x007b880,0x007b885,0x007b88c,0x007b891,0x007b894,0x007b89d,0x007b8a0,0x007b8a5,0x007b8cc,
    0x007b8d1,0x007b8e0,0x007b8e5,0x007b8e8,0x007b8ed,0x007b8f0,0x007b909,0x007b90c,0x007b91d,0x007b920,0x007b925,0x007b928,
    0x007b92d,0x007b930,0x007b935,0x007b940,0x007b945,0x007b94c,0x007b951,0x007b954,0x007b95d,0x007b960,0x007b965,0x007b968,
    0x007b96d,0x007b970,0x007b975,0x007b978,0x007b97d,0x007b980,0x007b985,0x007b98c,0x007b991,0x007b994,0x007b99d,0x007b9ac,
    0x007b9b1,0x007b9cc,0x007b9d1,0x007b9e0,0x007b9e5,0x007b9f4,0x007b9f9,0x007b9fc,0x007ba01,0x007ba28,0x007ba2d,0x007ba70,
    0x007ba85,0x007ba90,0x007ba95,0x007baa8,0x007baad,0x007baf0,0x007c402,0x007c434,0x007efc2,0x007efe8,0x0080001,0x00a9b80,
    0x00a9c01,0x00adce8,0x00add01,0x00ae078,0x00ae081,0x00b3a88,0x00b3ac1,0x00baf84,0x00be001,0x00be878,0x00c0001,0x00c4d2c,
    0x00c4d41,0x00c8ec0,
};
// END GENERATED

static int mt__unicode_class(uint32_t cp) {
    // invariant: start(lo) <= cp < start(hi), where start(N) is "infinity"
    size_t lo = 0, hi = sizeof mt__unicode_steps / sizeof mt__unicode_steps[0];
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((mt__unicode_steps[mid] >> 2) <= cp) lo = mid; else hi = mid;
    }
    return (int)(mt__unicode_steps[lo] & 3);
}

// one UTF-8 character at text[0..n): returns its length 1..4 and sets *cp, or returns 0 if the bytes
// there are not valid UTF-8 (a stray continuation byte, a truncated sequence, an overlong
// encoding, a surrogate, or a value above U+10FFFF)
int mt_utf8_decode(const char *text, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)text;
    unsigned char b = s[0];
    if (b < 0x80) { *cp = b; return 1; }
    int len;
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) { len = 2; c = b & 0x1Fu; }       // C0, C1 would be overlong
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; c = b & 0x0Fu; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; c = b & 0x07u; }  // F5.. would pass U+10FFFF
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[i] & 0x3Fu);
    }
    if (len == 3 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) return 0;
    if (len == 4 && (c < 0x10000 || c > 0x10FFFF)) return 0;
    *cp = c;
    return len;
}
static int mt__utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// the class and byte length of the character at s[0..n). A byte that does not start valid
// UTF-8 counts as one character of class "other": tiktoken only ever sees valid text (a Python
// str), so any rule works for it; this one keeps every byte inside some piece, and so
// decode(encode(x)) == x holds for any bytes.
static int mt__char_class(const unsigned char *s, size_t n, int *len) {
    if (s[0] < 0x80) { *len = 1; return mt__ascii_class[s[0]]; }
    uint32_t cp;
    int l = mt_utf8_decode((const char *)s, n, &cp);
    if (l == 0) { *len = 1; return MT__OTHER; }
    *len = l;
    return mt__unicode_class(cp);
}

// ---------------------------------------------------------------------------------------------
// pre-tokenization: GPT-2's regex, written out by hand
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// A regex engine tries the alternatives left to right at the current position and takes the
// first that matches (each "+" as long as it can). Here is what that comes to, case by case:
//   1. an apostrophe and s t m d (or re ve ll) is a piece: "it's" -> "it" "'s". Lowercase
//      only: "IT'S" -> "IT" "'" "S".
//   2. an optional single space, then a run of one class, letters OR numbers OR other (not
//      space, letter or number): " world", " 2024", " --". The space glues to the run after it.
//   3. whitespace: \s+(?!\S) matches a run of whitespace that is not followed by a non-space,
//      so before a word the regex backs off one character and leaves the last one for the
//      word: "a   b" -> "a" "  " " b". At the end of the text the whole run goes.
//   4. \s+ catches what 3 leaves: a single whitespace character before a non-space ("\nA",
//      or a tab before a word, which case 2 does not take since its optional prefix is a space).
// tiktoken's version of the pattern ('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ... |\s++$|\s+(?!\S)|\s)
// is the same language written for a faster engine; the tests check both (tests/tiktoken_fuzz.py).
size_t mt_gpt2_next_piece(const char *text, size_t n, size_t i) {
    const unsigned char *s = (const unsigned char *)text;
    // 1. contractions
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            unsigned char b = s[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    // 2. ' ?' then a run of letters, numbers or others
    int len, cls = mt__char_class(s + i, n - i, &len);
    size_t j = i;                       // where the run starts (after the optional space)
    if (s[i] == ' ' && i + 1 < n) {
        int len1, cls1 = mt__char_class(s + i + 1, n - i - 1, &len1);
        if (cls1 != MT__SPACE) { j = i + 1; cls = cls1; len = len1; }
    }
    if (cls != MT__SPACE) {
        size_t k = j + (size_t)len;
        if (cls == MT__LETTER) {        // the common case, ASCII letters, without a call
            while (k < n && s[k] < 0x80 && mt__ascii_class[s[k]] == MT__LETTER) k++;
        }
        while (k < n) {
            int l;
            if (mt__char_class(s + k, n - k, &l) != cls) break;
            k += (size_t)l;
        }
        return k;
    }
    // 3. and 4. a whitespace run [i, k); `last` is where its last character starts
    size_t last = i, k = i + (size_t)len;
    while (k < n) {
        int l;
        if (mt__char_class(s + k, n - k, &l) != MT__SPACE) break;
        last = k;
        k += (size_t)l;
    }
    if (k == n) return n;          // 3. at the end of the text: the whole run
    if (last > i) return last;     // 3. before a non-space: all but the last character
    return k;                      // 4. a single whitespace character before a non-space
}

// ---------------------------------------------------------------------------------------------
// the vocabulary: token bytes <-> id
// a slot holds the token's length and first 8 bytes, so most lookups (GPT-2's tokens are
// about 6 bytes long) are decided in the slot, without a memcmp call on bytes elsewhere in memory
struct mt__vocab_slot {
    uint64_t head;     // first 8 bytes of the token, zero-padded (mt__hash_bytes)
    uint32_t len;      // its length in bytes
    int32_t id;        // -1: empty slot
};

static int32_t mt__vocab_find(const mt_tokenizer *t, const unsigned char *s, size_t n, uint64_t h, uint64_t head) {
    for (size_t i = (size_t)h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        const struct mt__vocab_slot *slot = &t->vocab_slots[i];
        if (slot->id < 0) return -1;
        if (slot->head == head && slot->len == n &&
            (n <= 8 || memcmp(t->bytes + t->offsets[slot->id] + 8, s + 8, n - 8) == 0)) return slot->id;
    }
}

int32_t mt_tokenizer_token_id(const mt_tokenizer *t, const char *bytes, size_t len) {
    const unsigned char *s = (const unsigned char *)bytes;
    uint64_t head;
    uint64_t h = mt__hash_bytes(s, len, &head);
    return mt__vocab_find(t, s, len, h, head);
}

const char *mt_tokenizer_token_bytes(const mt_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size) { *len = 0; return NULL; }
    *len = t->offsets[id + 1] - t->offsets[id];
    return t->bytes + t->offsets[id];
}

// ---------------------------------------------------------------------------------------------
// the merge table: (left id, right id) -> (rank, merged id)
// merges.txt line r (0-based, after the header) says "tokens A and B merge into token AB, with
// rank r"; lower rank = learned earlier = merged first. For GPT-2, AB's id is 256 + r.
// tiktoken ranks a pair by the bytes it would form: two adjacent parts merge if their
// concatenation is a token, at that token's rank, whichever two parts formed it (merges.txt
// may have made "abc" from "ab"+"c" while the parts at hand are "a"+"bc"). So the table holds
// every split of every merged token into two tokens: 108,299 pairs for GPT-2, of which 50,000
// are merges.txt's lines. That makes the rule tiktoken's by construction. For GPT-2's own files,
// merges.txt's pairs alone (what OpenAI's encoder.py and Megatron use) gave the same ids on
// every piece we tried: all of the corpus's and 400,000 random ones.
struct mt__pair_slot {
    uint64_t key;      // (left << 32) | right; UINT64_MAX: empty slot
    int32_t rank;
    int32_t id;
};
#define MT__NO_RANK INT32_MAX

static uint64_t mt__pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

// rank of merging tokens a and b (MT__NO_RANK if they do not merge); *merged gets the new id
static int32_t mt__pair_rank(const mt_tokenizer *t, int32_t a, int32_t b, int32_t *merged) {
    uint64_t key = mt__pair_key(a, b);
    for (size_t i = (size_t)mt__mix64(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const struct mt__pair_slot *slot = &t->pair_slots[i];
        if (slot->key == key) { *merged = slot->id; return slot->rank; }
        if (slot->key == UINT64_MAX) return MT__NO_RANK;
    }
}

// ---------------------------------------------------------------------------------------------
// BPE on one piece, two ways with the same result
// The rule (tiktoken's byte_pair_merge): while some adjacent pair merges, merge the pair of
// lowest rank; on a tie (the same token twice, as in "aaaa"), the leftmost.
//   mt__bpe_small: arrays and a linear scan per merge, O(n^2), fastest for normal words
//   mt__bpe_large: a linked list of parts and a min-heap of pairs keyed (rank, position),
//                  O(n log n), for long pieces (a 100 kB run of digits must not take minutes)
// The heap keeps stale entries (pairs that a later merge destroyed) and drops them when they
// come out: an entry is live if its left part still exists and still forms a pair of that rank
// with its right neighbour. Equal ranks mean equal tokens, so a live entry is always right.
#define MT__BPE_SMALL 128

static size_t mt__bpe_small(const mt_tokenizer *t, const unsigned char *s, size_t n, int32_t *out) {
    int32_t id[MT__BPE_SMALL], rank[MT__BPE_SMALL], merged[MT__BPE_SMALL];
    // rank[k] and merged[k] describe the pair (id[k], id[k+1])
    for (size_t k = 0; k < n; k++) id[k] = t->byte_id[s[k]];
    for (size_t k = 0; k + 1 < n; k++) rank[k] = mt__pair_rank(t, id[k], id[k + 1], &merged[k]);
    size_t m = n;   // parts left
    for (;;) {
        int32_t best = MT__NO_RANK;
        size_t k = 0;
        for (size_t i = 0; i + 1 < m; i++) if (rank[i] < best) { best = rank[i]; k = i; }
        if (best == MT__NO_RANK) break;
        // merge parts k and k+1 into part k, close the gap
        id[k] = merged[k];
        size_t tail = m - k - 2;   // parts after k+1
        memmove(&id[k + 1], &id[k + 2], tail * sizeof(int32_t));
        memmove(&rank[k + 1], &rank[k + 2], tail * sizeof(int32_t));
        memmove(&merged[k + 1], &merged[k + 2], tail * sizeof(int32_t));
        m--;
        // only the pairs that touch the new part change
        if (k + 1 < m) rank[k] = mt__pair_rank(t, id[k], id[k + 1], &merged[k]);
        if (k > 0) rank[k - 1] = mt__pair_rank(t, id[k - 1], id[k], &merged[k - 1]);
    }
    memcpy(out, id, m * sizeof(int32_t));
    return m;
}

static void mt__heap_push(uint64_t *heap, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && heap[(i - 1) / 2] > v) { heap[i] = heap[(i - 1) / 2]; i = (i - 1) / 2; }
    heap[i] = v;
}
static uint64_t mt__heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0], v = heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap[c + 1] < heap[c]) c++;
        if (heap[c] >= v) break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0) heap[i] = v;
    return top;
}

static size_t mt__bpe_large(const mt_tokenizer *t, const unsigned char *s, size_t n, int32_t *out) {
    // part p starts at byte p (positions never move, so p is also its left-to-right order)
    int32_t *id = (int32_t *)mt_malloc(n * sizeof(int32_t), "BPE parts");     // -1: merged away
    int64_t *next = (int64_t *)mt_malloc(n * sizeof(int64_t), "BPE parts");   // -1: none
    int64_t *prev = (int64_t *)mt_malloc(n * sizeof(int64_t), "BPE parts");
    uint64_t *heap = (uint64_t *)mt_malloc(3 * n * sizeof(uint64_t), "BPE heap"); // (rank << 32) | p
    size_t nheap = 0;
    int32_t merged;
    for (size_t p = 0; p < n; p++) {
        id[p] = t->byte_id[s[p]];
        next[p] = p + 1 < n ? (int64_t)p + 1 : -1;
        prev[p] = (int64_t)p - 1;
    }
    for (size_t p = 0; p + 1 < n; p++) {
        int32_t r = mt__pair_rank(t, id[p], id[p + 1], &merged);
        if (r != MT__NO_RANK) mt__heap_push(heap, &nheap, ((uint64_t)r << 32) | p);
    }
    while (nheap > 0) {
        uint64_t e = mt__heap_pop(heap, &nheap);
        int32_t r = (int32_t)(e >> 32);
        size_t p = (size_t)(e & 0xffffffffu);
        if (id[p] < 0 || next[p] < 0) continue;                          // stale
        size_t q = (size_t)next[p];
        if (mt__pair_rank(t, id[p], id[q], &merged) != r) continue;    // stale
        id[p] = merged;            // p absorbs q
        id[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = (int64_t)p;
        if (prev[p] >= 0) {
            size_t o = (size_t)prev[p];
            int32_t r2 = mt__pair_rank(t, id[o], id[p], &merged);
            if (r2 != MT__NO_RANK) mt__heap_push(heap, &nheap, ((uint64_t)r2 << 32) | o);
        }
        if (next[p] >= 0) {
            int32_t r2 = mt__pair_rank(t, id[p], id[next[p]], &merged);
            if (r2 != MT__NO_RANK) mt__heap_push(heap, &nheap, ((uint64_t)r2 << 32) | p);
        }
    }
    size_t m = 0;
    for (int64_t p = 0; p >= 0; p = next[p]) out[m++] = id[p];
    free(id); free(next); free(prev); free(heap);
    return m;
}

// ---------------------------------------------------------------------------------------------
// the word cache: piece bytes -> ids, one per thread
// Text repeats its words, so each distinct piece needs BPE once. Pieces that are one token
// (most English words with their space) are answered by the vocabulary map and never get
// here; the cache holds the pieces that split into several tokens. Keys and ids live in two
// growing arenas; at MT__CACHE_MAX_SLOTS or MT__CACHE_MAX_BYTES the cache empties and starts
// over, which bounds its memory on endless input. Not shared between threads: no locks.
struct mt__cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len;   // key_len 0: empty slot
    uint32_t ids_off, n_ids;
};
#define MT__CACHE_MAX_WORD 256            // longer pieces are rare: not cached
#define MT__CACHE_MAX_SLOTS (1u << 19)    // 12 MB of slots, up to 262,144 words
#define MT__CACHE_MAX_BYTES (32u << 20)   // per arena

static int mt__cache_find(const mt_bpe_cache *c, const unsigned char *s, size_t n, uint64_t h, mt_int_list *out) {
    if (!c->slots) return 0;
    for (size_t i = (size_t)h & c->mask;; i = (i + 1) & c->mask) {
        const struct mt__cache_slot *slot = &c->slots[i];
        if (slot->key_len == 0) return 0;
        if (slot->hash == h && slot->key_len == n && memcmp(c->keys + slot->key_off, s, n) == 0) {
            mt_int_list_reserve(out, slot->n_ids);
            memcpy(out->data + out->len, c->ids + slot->ids_off, slot->n_ids * sizeof(int32_t));
            out->len += slot->n_ids;
            return 1;
        }
    }
}

static void mt__cache_place(struct mt__cache_slot *slots, size_t mask, const struct mt__cache_slot *e) {
    size_t i = (size_t)e->hash & mask;
    while (slots[i].key_len != 0) i = (i + 1) & mask;
    slots[i] = *e;
}

static void mt__cache_insert(mt_bpe_cache *c, const unsigned char *s, size_t n, uint64_t h,
                             const int32_t *ids, size_t n_ids) {
    int full = c->keys_len + n > MT__CACHE_MAX_BYTES || (c->ids_len + n_ids) * sizeof(int32_t) > MT__CACHE_MAX_BYTES;
    if (!c->slots || (c->count + 1) * 2 > c->mask + 1) {
        size_t cap = c->slots ? 2 * (c->mask + 1) : 4096;
        if (cap > MT__CACHE_MAX_SLOTS) full = 1;
        else {   // grow: re-place every entry in a table twice the size
            struct mt__cache_slot *slots = (struct mt__cache_slot *)mt_calloc(cap, sizeof *slots, "BPE cache");
            for (size_t i = 0; c->slots && i <= c->mask; i++)
                if (c->slots[i].key_len) mt__cache_place(slots, cap - 1, &c->slots[i]);
            free(c->slots);
            c->slots = slots;
            c->mask = cap - 1;
        }
    }
    if (full) {   // start over with an empty cache of the same size
        memset(c->slots, 0, (c->mask + 1) * sizeof *c->slots);
        c->count = c->keys_len = c->ids_len = 0;
    }
    if (c->keys_len + n > c->keys_cap) {
        c->keys_cap = mt__pow2_at_least(c->keys_len + n + 65536);
        c->keys = (char *)mt_realloc(c->keys, c->keys_cap, "BPE cache");
    }
    if (c->ids_len + n_ids > c->ids_cap) {
        c->ids_cap = mt__pow2_at_least(c->ids_len + n_ids + 16384);
        c->ids = (int32_t *)mt_realloc(c->ids, c->ids_cap * sizeof(int32_t), "BPE cache");
    }
    struct mt__cache_slot e;
    e.hash = h;
    e.key_off = (uint32_t)c->keys_len;
    e.key_len = (uint32_t)n;
    e.ids_off = (uint32_t)c->ids_len;
    e.n_ids = (uint32_t)n_ids;
    memcpy(c->keys + c->keys_len, s, n);
    memcpy(c->ids + c->ids_len, ids, n_ids * sizeof(int32_t));
    c->keys_len += n;
    c->ids_len += n_ids;
    mt__cache_place(c->slots, c->mask, &e);
    c->count++;
}

void mt_bpe_cache_free(mt_bpe_cache *c) {
    free(c->slots);
    free(c->keys);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

// ---------------------------------------------------------------------------------------------
// encode and decode
// one piece: a single byte is its own token; a piece that is a token is taken whole (tiktoken
// does this too; for GPT-2, BPE builds every token from its own bytes, so it is only a shortcut,
// and the one most English words take); else the cache; else BPE, and remember the result.
static void mt__encode_piece(const mt_tokenizer *t, mt_bpe_cache *c, const unsigned char *s, size_t n,
                             mt_int_list *out) {
    if (n == 1) { mt_int_list_push(out, t->byte_id[s[0]]); return; }
    uint64_t head;
    uint64_t h = mt__hash_bytes(s, n, &head);
    int32_t id = mt__vocab_find(t, s, n, h, head);
    if (id >= 0 && id != t->eod_id) { mt_int_list_push(out, id); return; }
    if (c && n <= MT__CACHE_MAX_WORD && mt__cache_find(c, s, n, h, out)) { c->hits++; return; }
    mt_int_list_reserve(out, n);   // BPE never gives more tokens than bytes
    int32_t *ids = out->data + out->len;
    size_t m = n <= MT__BPE_SMALL ? mt__bpe_small(t, s, n, ids) : mt__bpe_large(t, s, n, ids);
    out->len += m;
    if (c && n <= MT__CACHE_MAX_WORD) { c->misses++; mt__cache_insert(c, s, n, h, ids, m); }
}

size_t mt_tokenizer_encode(const mt_tokenizer *t, mt_bpe_cache *cache, const char *text, size_t len,
                           mt_int_list *out) {
    size_t before = out->len;
    for (size_t pos = 0; pos < len;) {
        size_t end = mt_gpt2_next_piece(text, len, pos);
        mt__encode_piece(t, cache, (const unsigned char *)text + pos, end - pos, out);
        pos = end;
    }
    return out->len - before;
}

size_t mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size)
            mt_fatal("cannot decode token id %d: the vocabulary has ids 0..%d\n"
                     "hint: ids past the vocabulary come from a padded output layer (--make-vocab-size-divisible-by); "
                     "sample only from the first %d logits",
                     (int)id, t->vocab_size - 1, t->vocab_size);
        size_t len = t->offsets[id + 1] - t->offsets[id];
        if (total < cap) memcpy(out + total, t->bytes + t->offsets[id], len < cap - total ? len : cap - total);
        total += len;
    }
    if (total < cap) out[total] = '\0';
    return total;
}

// ---------------------------------------------------------------------------------------------
// JSON strings: "..." with \" \\ \/ \b \f \n \r \t \uXXXX (and UTF-16 surrogate pairs for
// code points above U+FFFF: "\ud83d\ude00" is U+1F600) -> UTF-8 bytes
static int mt__hex4(const char *p, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0) return 0;
        x = x * 16 + (uint32_t)d;
    }
    *v = x;
    return 1;
}

const char *mt_json_string(const char **pp, const char *end, char *out, size_t *out_len) {
    const char *p = *pp;
    size_t o = 0;   // out is written strictly behind p, so out may be the input itself
    if (p >= end || *p != '"') return "expected a string";
    p++;
    for (;;) {
        if (p >= end) { *pp = p; return "unterminated string"; }
        unsigned char ch = (unsigned char)*p;
        if (ch == '"') { p++; break; }
        if (ch < 0x20) { *pp = p; return "raw control character in a string (JSON needs \\n, \\t or \\u00XX)"; }
        if (ch >= 0x80) {   // raw UTF-8: check it, copy it
            uint32_t cp;
            int l = mt_utf8_decode(p, (size_t)(end - p), &cp);
            if (l == 0) { *pp = p; return "invalid UTF-8 in a string"; }
            for (int i = 0; i < l; i++) out[o++] = p[i];
            p += l;
            continue;
        }
        if (ch != '\\') { out[o++] = (char)ch; p++; continue; }
        if (end - p < 2) { *pp = p; return "unterminated string"; }
        char e = p[1];
        p += 2;
        switch (e) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            uint32_t u;
            if (end - p < 4 || !mt__hex4(p, &u)) { *pp = p - 2; return "bad \\u escape (needs 4 hex digits)"; }
            p += 4;
            if (u >= 0xD800 && u <= 0xDBFF) {   // high surrogate: a low one must follow
                uint32_t lo;
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !mt__hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    *pp = p - 6;
                    return "lone UTF-16 surrogate \\uD800..\\uDBFF (not encodable as UTF-8)";
                }
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            } else if (u >= 0xDC00 && u <= 0xDFFF) {
                *pp = p - 6;
                return "lone UTF-16 surrogate \\uDC00..\\uDFFF (not encodable as UTF-8)";
            }
            o += (size_t)mt__utf8_encode(u, out + o);
            break;
        }
        default: *pp = p - 2; return "invalid escape in a string";
        }
    }
    *pp = p;
    *out_len = o;
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// loading vocab.json and merges.txt
static char *mt__read_file(const char *path, size_t *len, const char *what, const char *flag) {
    FILE *f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open %s %s: %s\nhint: check %s", what, path, strerror(errno), flag);
    size_t cap = 1 << 20, n = 0;
    char *buf = (char *)mt_malloc(cap + 1, what);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        buf = (char *)mt_realloc(buf, cap + 1, what);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) mt_fatal("cannot read %s %s: %s\nhint: check %s", what, path, strerror(errno), flag);
    buf[n] = '\0';
    *len = n;
    return buf;
}

// the byte alphabet of the files (see the top of this part): code point -> byte, -1 if none
static void mt__gpt2_unicode_to_byte(int16_t table[324]) {
    for (int i = 0; i < 324; i++) table[i] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        table[printable ? b : next++] = (int16_t)b;
    }
}

// token text (UTF-8 of the byte alphabet) -> bytes; returns the byte count, or -1 with *bad_cp
// set to the first code point outside the alphabet
static long mt__alphabet_to_bytes(const int16_t u2b[324], const char *s, size_t n, char *out, uint32_t *bad_cp) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = mt_utf8_decode(s + i, n - i, &cp);
        if (l == 0) { *bad_cp = 0xFFFD; return -1; }
        if (cp >= 324 || u2b[cp] < 0) { *bad_cp = cp; return -1; }
        out[o++] = (char)u2b[cp];
        i += (size_t)l;
    }
    return (long)o;
}

static void mt__vocab_insert(mt_tokenizer *t, int32_t id) {
    uint32_t off = t->offsets[id];
    size_t n = t->offsets[id + 1] - off;
    uint64_t head;
    uint64_t h = mt__hash_bytes((const unsigned char *)t->bytes + off, n, &head);
    size_t i = (size_t)h & t->vocab_mask;
    while (t->vocab_slots[i].id >= 0) i = (i + 1) & t->vocab_mask;
    t->vocab_slots[i].head = head;
    t->vocab_slots[i].len = (uint32_t)n;
    t->vocab_slots[i].id = id;
}

static void mt__pair_insert(mt_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = mt__pair_key(a, b);
    size_t i = (size_t)mt__mix64(key) & t->pair_mask;
    while (t->pair_slots[i].key != UINT64_MAX && t->pair_slots[i].key != key) i = (i + 1) & t->pair_mask;
    struct mt__pair_slot *slot = &t->pair_slots[i];
    if (slot->key == key && slot->rank <= rank) return;   // keep the earlier merge
    if (slot->key != key) t->n_pairs++;
    slot->key = key;
    slot->rank = rank;
    slot->id = id;
}

#define MT__VOCAB_HINT "hint: --vocab-file must be a GPT-2 style vocab.json (encoder.json), e.g. data/gpt2-vocab.json"
#define MT__MERGES_HINT "hint: --merge-file must be the merges.txt (vocab.bpe) that goes with --vocab-file, e.g. data/gpt2-merges.txt"

// vocab.json: one JSON object {"token": id, ...}. ids must be 0..N-1, each used once.
static void mt__load_vocab(mt_tokenizer *t, const char *path, const int16_t u2b[324]) {
    size_t len;
    char *buf = mt__read_file(path, &len, "vocab file", "--vocab-file");
    const char *p = buf, *end = buf + len;
    size_t cap = 65536, n = 0;
    int32_t *ids = (int32_t *)mt_malloc(cap * sizeof(int32_t), "vocab");
    uint32_t *offs = (uint32_t *)mt_malloc((cap + 1) * sizeof(uint32_t), "vocab");
    char *bytes = (char *)mt_malloc(len + 1, "vocab");   // the bytes are shorter than the file
    size_t nbytes = 0;
    const char *err = NULL;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    if (p >= end || *p != '{') err = "expected '{' (vocab.json is one JSON object)";
    else p++;
    while (!err) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (n == 0 && p < end && *p == '}') { p++; break; }
        // "token"
        char *tok = bytes + nbytes;
        size_t toklen;
        const char *serr = mt_json_string(&p, end, tok, &toklen);
        if (serr) { err = serr; break; }
        uint32_t bad_cp = 0;
        long nb = mt__alphabet_to_bytes(u2b, tok, toklen, tok, &bad_cp);   // in place: never longer
        if (nb < 0) {
            mt_fatal("%s: token \"%.*s\" (entry %zu) has the character U+%04X, which is not one of the 256 "
                     "characters GPT-2 uses to write bytes\n" MT__VOCAB_HINT,
                     path, (int)toklen, tok, n + 1, (unsigned)bad_cp);
        }
        // : id
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (p >= end || *p != ':') { err = "expected ':' after a token"; break; }
        p++;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (p >= end || *p < '0' || *p > '9') { err = "expected a token id (a non-negative integer)"; break; }
        long long id = 0;
        while (p < end && *p >= '0' && *p <= '9' && id < (1LL << 40)) id = id * 10 + (*p++ - '0');
        if (id > INT32_MAX - 1) { err = "token id too large"; break; }
        if (n == cap) {
            cap *= 2;
            ids = (int32_t *)mt_realloc(ids, cap * sizeof(int32_t), "vocab");
            offs = (uint32_t *)mt_realloc(offs, (cap + 1) * sizeof(uint32_t), "vocab");
        }
        ids[n] = (int32_t)id;
        offs[n] = (uint32_t)nbytes;
        nbytes += (size_t)nb;
        n++;
        offs[n] = (uint32_t)nbytes;
        // , or }
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (p < end && *p == ',') { p++; continue; }
        if (p < end && *p == '}') { p++; break; }
        err = "expected ',' or '}' after a token id";
    }
    if (!err) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (p != end) err = "text after the closing '}'";
    }
    if (err) mt_fatal("%s is not a valid vocab.json: %s at byte %zu\n" MT__VOCAB_HINT, path, err, (size_t)(p - buf));
    if (n < 256) mt_fatal("%s has %zu tokens; a byte-level vocabulary has at least the 256 single bytes\n" MT__VOCAB_HINT, path, n);
    // lay the tokens out by id
    t->vocab_size = (int)n;
    t->offsets = (uint32_t *)mt_calloc(n + 1, sizeof(uint32_t), "vocab");
    uint32_t *len_of = (uint32_t *)mt_malloc(n * sizeof(uint32_t), "vocab");
    int32_t *entry_of = (int32_t *)mt_malloc(n * sizeof(int32_t), "vocab");
    for (size_t i = 0; i < n; i++) entry_of[i] = -1;
    for (size_t i = 0; i < n; i++) {
        if ((size_t)ids[i] >= n)
            mt_fatal("%s: token id %d is out of range: %zu tokens must have ids 0..%zu\n" MT__VOCAB_HINT,
                     path, (int)ids[i], n, n - 1);
        if (entry_of[ids[i]] >= 0) mt_fatal("%s: token id %d is used twice\n" MT__VOCAB_HINT, path, (int)ids[i]);
        entry_of[ids[i]] = (int32_t)i;
        len_of[ids[i]] = offs[i + 1] - offs[i];
    }
    for (size_t id = 0; id < n; id++) t->offsets[id + 1] = t->offsets[id] + len_of[id];
    t->bytes = (char *)mt_malloc(t->offsets[n] + 1, "vocab");
    for (size_t id = 0; id < n; id++) memcpy(t->bytes + t->offsets[id], bytes + offs[entry_of[id]], len_of[id]);
    // the bytes -> id map
    t->vocab_mask = mt__pow2_at_least(2 * n) - 1;
    t->vocab_slots = (struct mt__vocab_slot *)mt_malloc((t->vocab_mask + 1) * sizeof(struct mt__vocab_slot), "vocab");
    for (size_t i = 0; i <= t->vocab_mask; i++) { t->vocab_slots[i].id = -1; t->vocab_slots[i].head = 0; t->vocab_slots[i].len = 0; }
    for (size_t id = 0; id < n; id++) {
        size_t tl;
        const char *tb = mt_tokenizer_token_bytes(t, (int32_t)id, &tl);
        if (mt_tokenizer_token_id(t, tb, tl) >= 0)
            mt_fatal("%s: two tokens have the same bytes \"%.*s\" (ids %d and %zu)\n" MT__VOCAB_HINT,
                     path, (int)tl, tb, (int)mt_tokenizer_token_id(t, tb, tl), id);
        mt__vocab_insert(t, (int32_t)id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = mt_tokenizer_token_id(t, &c, 1);
        if (t->byte_id[b] < 0) mt_fatal("%s has no token for the byte 0x%02X; a byte-level vocabulary has all 256\n" MT__VOCAB_HINT, path, b);
    }
    t->eod_id = mt_tokenizer_token_id(t, MT_EOD_TEXT, strlen(MT_EOD_TEXT));
    free(len_of); free(entry_of); free(ids); free(offs); free(bytes); free(buf);
}

// merges.txt: "#version: 0.2", then one "A B" per line, highest priority first
static void mt__load_merges(mt_tokenizer *t, const char *path, const int16_t u2b[324], const char *vocab_path) {
    size_t len;
    char *buf = mt__read_file(path, &len, "merges file", "--merge-file");
    if (len < 8 || memcmp(buf, "#version", 8) != 0)
        mt_fatal("%s: line 1 is not the \"#version: 0.2\" header of a merges.txt\n" MT__MERGES_HINT, path);
    int32_t *rank_of = (int32_t *)mt_malloc((size_t)t->vocab_size * sizeof(int32_t), "merges"); // token -> rank
    for (int i = 0; i < t->vocab_size; i++) rank_of[i] = MT__NO_RANK;
    char *tmp = (char *)mt_malloc(len + 1, "merges");
    char *line = (char *)memchr(buf, '\n', len);
    int lineno = 1, rank = 0;
    while (line && line + 1 < buf + len) {
        char *s = line + 1;
        lineno++;
        char *e = (char *)memchr(s, '\n', (size_t)(buf + len - s));
        if (!e) e = buf + len;
        line = e < buf + len ? e : NULL;
        if (e > s && e[-1] == '\r') e--;   // tolerate \r\n
        if (e == s) continue;              // blank line (the end of the file)
        char *sp = (char *)memchr(s, ' ', (size_t)(e - s));
        if (!sp || sp == s || sp + 1 == e || memchr(sp + 1, ' ', (size_t)(e - sp - 1)))
            mt_fatal("%s line %d: expected two tokens separated by one space, got \"%.*s\"\n" MT__MERGES_HINT,
                     path, lineno, (int)(e - s), s);
        // A and B in the byte alphabet -> bytes, then their ids and the merged token's id
        const char *part[2] = {s, sp + 1};
        size_t plen[2] = {(size_t)(sp - s), (size_t)(e - sp - 1)};
        int32_t pid[2];
        size_t at = 0;
        for (int k = 0; k < 2; k++) {
            uint32_t bad_cp = 0;
            long nb = mt__alphabet_to_bytes(u2b, part[k], plen[k], tmp + at, &bad_cp);
            if (nb < 0)
                mt_fatal("%s line %d: \"%.*s\" has the character U+%04X, which GPT-2's byte alphabet does not use\n" MT__MERGES_HINT,
                         path, lineno, (int)plen[k], part[k], (unsigned)bad_cp);
            pid[k] = mt_tokenizer_token_id(t, tmp + at, (size_t)nb);
            if (pid[k] < 0)
                mt_fatal("%s line %d: the merge \"%.*s\" names \"%.*s\", which is not a token of %s\n" MT__MERGES_HINT,
                         path, lineno, (int)(e - s), s, (int)plen[k], part[k], vocab_path);
            at += (size_t)nb;
        }
        int32_t merged = mt_tokenizer_token_id(t, tmp, at);
        if (merged < 0)
            mt_fatal("%s line %d: the merge \"%.*s\" makes a token that is not in %s\n" MT__MERGES_HINT,
                     path, lineno, (int)(e - s), s, vocab_path);
        if (rank_of[merged] == MT__NO_RANK) rank_of[merged] = rank;
        rank++;
    }
    t->n_merges = rank;
    // every split of every merged token into two tokens (see "the merge table")
    size_t bound = 0;
    for (int id = 0; id < t->vocab_size; id++)
        if (rank_of[id] != MT__NO_RANK) bound += t->offsets[id + 1] - t->offsets[id] - 1;
    t->pair_mask = mt__pow2_at_least(2 * bound) - 1;
    t->pair_slots = (struct mt__pair_slot *)mt_malloc((t->pair_mask + 1) * sizeof(struct mt__pair_slot), "merges");
    for (size_t i = 0; i <= t->pair_mask; i++) { t->pair_slots[i].key = UINT64_MAX; t->pair_slots[i].rank = 0; t->pair_slots[i].id = -1; }
    t->n_pairs = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        if (rank_of[id] == MT__NO_RANK) continue;
        const char *tb = t->bytes + t->offsets[id];
        size_t tl = t->offsets[id + 1] - t->offsets[id];
        for (size_t k = 1; k < tl; k++) {
            int32_t a = mt_tokenizer_token_id(t, tb, k), b = mt_tokenizer_token_id(t, tb + k, tl - k);
            if (a >= 0 && b >= 0) mt__pair_insert(t, a, b, rank_of[id], (int32_t)id);
        }
    }
    free(rank_of); free(tmp); free(buf);
}

void mt_tokenizer_load(mt_tokenizer *t, const char *vocab_path, const char *merges_path) {
    memset(t, 0, sizeof *t);
    int16_t u2b[324];
    mt__gpt2_unicode_to_byte(u2b);
    mt__load_vocab(t, vocab_path, u2b);
    mt__load_merges(t, merges_path, u2b, vocab_path);
}

void mt_tokenizer_free(mt_tokenizer *t) {
    free(t->bytes);
    free(t->offsets);
    free(t->vocab_slots);
    free(t->pair_slots);
    memset(t, 0, sizeof *t);
}
