// uPlot draws on a canvas, which jsdom does not implement: `vi.mock('uplot', () => import('../test/uplotStub'))`.
export default class {
  static rangeNum() {
    return [0, 1]
  }
  setData() {}
  setSize() {}
  destroy() {}
}
